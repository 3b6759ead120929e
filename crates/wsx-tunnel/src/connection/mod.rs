//! A connection: one peer, its keys, its streams, its reliability and congestion state.
//!
//! The connection is a sans-IO state machine in the shape of quinn-proto's: the driver feeds
//! it datagrams (`handle_datagram`), expired timers (`handle_timeout`) and application calls
//! (streams, control messages), and collects what it wants to send (`poll_transmit`), when
//! it next needs waking (`poll_timeout`) and what happened (`poll_event`). Time is always an
//! argument.
//!
//! Sending: each call to `poll_transmit` builds a burst of equal-size packets for one GSO send,
//! as many as the pacer, the congestion window and the burst limit allow. Frames go in this
//! order: ACK (when one is due), stream credit and resets, control messages, PING, then stream
//! data chosen by the scheduler. ACKs ride on data packets when possible.
//!
//! Reliability follows RFC 9002: loss by packet threshold (3) and time threshold (9/8 RTT),
//! probe timeouts with exponential backoff. What a lost packet carried is queued again — never
//! the packet itself, whose number is never reused.
//!
//! Acknowledgements are economical (PROTOCOL.md §5): the receiver acknowledges every
//! [`TransportConfig::ack_every`] ack-eliciting packets or after [`TransportConfig::max_ack_delay`],
//! and early — at most once per `NAK_INTERVAL` — when a gap appears. Each ACK frame carries up
//! to 32 ranges, so a lost ACK costs nothing: the next one repeats it.
//!
//! Forward error correction (`fec.rs`, PROTOCOL.md §5.1) adds Reed-Solomon parity to blocks of
//! packets when the path loses them; the receiver rebuilds what it can without a round trip.

mod fec;
pub(crate) mod params;

use crate::coding::{Reader, Writer};
use crate::config::{FecMode, TransportConfig};
use crate::congestion::{
    AckEvent, Controller, ControllerState, DeliveryRate, LossEvent, LossVerdict, LostPacket,
    PacketSnapshot, PathHint, PathParams,
};
use crate::crypto::{self, Keys, PublicKey, SecretKey, TAG_LEN};
use crate::frame::{self, Frame, Frames};
use crate::pacing::Pacer;
use crate::packet::{
    DATA_HEADER_LEN, DataHeader, Header, INITIATION_HEADER_LEN, PARITY_HEADER_LEN,
};
use crate::range_set::RangeSet;
use crate::replay::ReplayWindow;
use crate::rtt::{GRANULARITY, INITIAL_RTT, RttEstimator};
use crate::streams::{
    PeerLimits, Schedule, StreamError, StreamEvent, StreamFrameSent, StreamId, StreamLimits,
    StreamMeta, Streams,
};
pub use fec::FecStats;
use fec::{Fec, Repair};
use params::TransportParams;
pub(crate) use params::{MAX_LEN as PARAMS_MAX_LEN, ParamsError};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// RFC 9002 kPacketThreshold.
const PACKET_THRESHOLD: u64 = 3;
/// RFC 9002 kTimeThreshold, as a fraction 9/8.
const TIME_THRESHOLD_NUM: u32 = 9;
const TIME_THRESHOLD_DEN: u32 = 8;
/// Consecutive probe timeouts taken as persistent congestion (RFC 9002 §7.6 uses a duration
/// of three PTOs; three backed-off PTOs in a row is a longer silence than that).
const PERSISTENT_CONGESTION_PTOS: u32 = 3;
/// Received-packet ranges remembered for ACK frames.
const ACK_RANGES_KEPT: usize = frame::MAX_ACK_RANGES;
/// The most control messages outstanding (sent, not yet acknowledged) or buffered out of order.
pub const MAX_CONTROL_MESSAGES: usize = 64;
/// The largest control message.
pub const MAX_CONTROL_LEN: usize = 1024;
/// The first handshake retry waits this long; each further one twice as long.
const HANDSHAKE_RETRY: Duration = Duration::from_secs(1);
/// Leftover room in a packet below which it is padded to full size, so that a burst's packets
/// stay equal-sized for GSO.
const PAD_BELOW: usize = 32;

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
    /// The peer broke the protocol; the connection was closed with this reason.
    #[error("protocol violation: {0}")]
    ProtocolViolation(String),
    /// A newer handshake from the same peer replaced this connection.
    #[error("replaced by a newer connection from the same peer")]
    Replaced,
    /// Full-size packets stopped getting through while the peer was still heard: the path
    /// most likely no longer carries `max_datagram`-sized datagrams (its MTU shrank).
    #[error("full-size packets are not getting through (path MTU below max_datagram?)")]
    PathBlackHole,
}

/// Something the application should know about.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// The handshake completed; streams can carry data.
    Connected,
    /// The peer opened a stream; its metadata is in [`Connection::stream_meta`].
    StreamOpened(StreamId),
    /// A stream has data (or its end) to read.
    StreamReadable(StreamId),
    /// A stream that refused a write has room again.
    StreamWritable(StreamId),
    /// The peer reset a stream.
    StreamReset { id: StreamId, code: u64 },
    /// A control message from the peer, in the order it was sent.
    Control(Vec<u8>),
    /// The connection ended.
    ConnectionLost(ConnectionError),
}

/// Datagrams to send: `size` bytes at the start of the caller's buffer, cut into segments of
/// `segment_size` (the last may be shorter) when there are several (GSO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    pub destination: SocketAddr,
    pub size: usize,
    pub segment_size: Option<usize>,
    /// When the pacer scheduled this burst to leave. A driver with kernel pacing
    /// (`SO_TXTIME`) can hand it down; others send at once, since `poll_transmit` releases a
    /// burst only when its time has come.
    pub departure: Instant,
}

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
    pub packets_received: u64,
    pub bytes_received: u64,
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
}

#[derive(Debug)]
enum State {
    /// Initiator waiting for the response.
    Handshake(Box<Initiation>),
    /// Responder: keys are ready, waiting for the initiator's first data packet to confirm
    /// them before sending anything but the response.
    AwaitingConfirmation {
        response: Option<Vec<u8>>,
        sent_at: Option<Instant>,
    },
    Established,
    /// Closed locally; the CLOSE frame is sent (again on each packet received) until `until`.
    Closing {
        until: Instant,
    },
    /// Closed by the peer; nothing is sent until `until`.
    Draining {
        until: Instant,
    },
    Drained,
}

struct Initiation {
    secret: SecretKey,
    handshake: Option<snow::HandshakeState>,
    unix_base: Duration,
    created: Instant,
    attempts: u32,
    next_attempt: Option<Instant>,
    sent_at: Option<Instant>,
}

impl std::fmt::Debug for Initiation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Initiation")
            .field("attempts", &self.attempts)
            .field("next_attempt", &self.next_attempt)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct SentPacket {
    time: Instant,
    size: u16,
    /// Parity sent for the packet's block, accounted with its last packet.
    parity_bytes: u32,
    /// The peer rebuilt it from parity: acknowledged, but lost on the path.
    recovered: bool,
    eliciting: bool,
    snapshot: PacketSnapshot,
    frames: Vec<SentFrame>,
}

#[derive(Debug, Clone, Copy)]
enum SentFrame {
    Stream(StreamFrameSent),
    Control(u64),
}

/// Reliable, ordered control messages.
#[derive(Debug, Default)]
struct ControlChannel {
    next_seq: u64,
    /// Sent or to send, by sequence number, until acknowledged.
    outgoing: BTreeMap<u64, Vec<u8>>,
    queued: VecDeque<u64>,
    /// Next sequence number to deliver, and messages that arrived ahead of it.
    expected: u64,
    early: BTreeMap<u64, Vec<u8>>,
}

/// See the module documentation.
#[derive(Debug)]
pub struct Connection {
    config: Arc<TransportConfig>,
    state: State,
    local_id: u32,
    remote_id: u32,
    remote: SocketAddr,
    peer: PublicKey,
    keys: Option<Keys>,
    replay: ReplayWindow,
    peer_params: Option<TransportParams>,
    hint: Option<PathHint>,
    next_pn: u64,
    sent: VecDeque<Option<SentPacket>>,
    sent_base: u64,
    in_flight: u64,
    eliciting_in_flight: u64,
    largest_acked: Option<u64>,
    loss_time: Option<Instant>,
    pto_count: u32,
    last_eliciting_sent: Option<Instant>,
    probes: u32,
    /// For black-hole detection: see [`BLACK_HOLE_AFTER`].
    large_unacked: Option<LargeUnacked>,
    rtt: RttEstimator,
    delivery: DeliveryRate,
    controller: Option<Box<dyn Controller>>,
    pacer: Pacer,
    received: RangeSet,
    largest_received: Option<(u64, Instant)>,
    unacked_eliciting: u32,
    ack_deadline: Option<Instant>,
    last_ack_sent: Option<Instant>,
    streams: Streams,
    control: ControlChannel,
    ping_pending: bool,
    events: VecDeque<Event>,
    last_heard: Instant,
    last_sent: Instant,
    close_frame: Option<(u64, Vec<u8>)>,
    close_resend: bool,
    stats: ConnectionStats,
    lost_scratch: Vec<LostPacket>,
    /// Acknowledged packets the peer rebuilt from parity: losses for the controller.
    recovered_scratch: Vec<LostPacket>,
    spare_frame_lists: Vec<Vec<SentFrame>>,
    /// Forward error correction, once the datagram size is agreed.
    fec: Option<Box<Fec>>,
    /// Where a rebuilt packet is processed.
    recovered_buf: Vec<u8>,
}

impl Connection {
    #[allow(clippy::too_many_arguments)]
    fn new(
        config: Arc<TransportConfig>,
        now: Instant,
        initiator: bool,
        state: State,
        local_id: u32,
        remote: SocketAddr,
        peer: PublicKey,
        hint: Option<PathHint>,
    ) -> Self {
        let limits = StreamLimits {
            max_remote_streams: config.max_concurrent_streams,
            stream_window: config.stream_window,
            connection_window: config.connection_window,
            stream_send_buffer: config.stream_send_buffer,
            connection_send_buffer: config.connection_send_buffer,
        };
        // Until the peer's parameters arrive, nothing is sent on streams.
        let no_credit = PeerLimits {
            max_streams: 0,
            stream_window: 0,
            connection_window: 0,
        };
        Self {
            streams: Streams::new(initiator, limits, no_credit),
            config,
            state,
            local_id,
            remote_id: 0,
            remote,
            peer,
            keys: None,
            replay: ReplayWindow::default(),
            peer_params: None,
            hint,
            next_pn: 0,
            sent: VecDeque::new(),
            sent_base: 0,
            in_flight: 0,
            eliciting_in_flight: 0,
            largest_acked: None,
            loss_time: None,
            pto_count: 0,
            last_eliciting_sent: None,
            probes: 0,
            large_unacked: None,
            rtt: RttEstimator::new(INITIAL_RTT),
            delivery: DeliveryRate::new(now),
            controller: None,
            pacer: Pacer::default(),
            received: RangeSet::new(),
            largest_received: None,
            unacked_eliciting: 0,
            ack_deadline: None,
            last_ack_sent: None,
            control: ControlChannel::default(),
            ping_pending: false,
            events: VecDeque::new(),
            last_heard: now,
            last_sent: now,
            close_frame: None,
            close_resend: false,
            stats: ConnectionStats::default(),
            lost_scratch: Vec::new(),
            recovered_scratch: Vec::new(),
            spare_frame_lists: Vec::new(),
            fec: None,
            recovered_buf: Vec::new(),
        }
    }

    /// A connection that initiates the handshake to `peer` at `remote`. `unix_time` is the
    /// wall-clock time now (since the Unix epoch): the responder refuses initiations that are
    /// not newer than the last one it accepted from this peer, which stops replays.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn initiate(
        config: Arc<TransportConfig>,
        now: Instant,
        unix_time: Duration,
        local_id: u32,
        remote: SocketAddr,
        secret: SecretKey,
        peer: PublicKey,
        hint: Option<PathHint>,
    ) -> Self {
        let initiation = Initiation {
            secret,
            handshake: None,
            unix_base: unix_time,
            created: now,
            attempts: 0,
            next_attempt: None,
            sent_at: None,
        };
        let state = State::Handshake(Box::new(initiation));
        Self::new(config, now, true, state, local_id, remote, peer, hint)
    }

    /// A connection accepted from an initiation; `response` is the datagram answering it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn accept(
        config: Arc<TransportConfig>,
        now: Instant,
        local_id: u32,
        remote_id: u32,
        remote: SocketAddr,
        peer: PublicKey,
        keys: Keys,
        peer_params: TransportParams,
        response: Vec<u8>,
        hint: Option<PathHint>,
    ) -> Self {
        let state = State::AwaitingConfirmation {
            response: Some(response),
            sent_at: None,
        };
        let mut conn = Self::new(config, now, false, state, local_id, remote, peer, hint);
        conn.remote_id = remote_id;
        conn.keys = Some(keys);
        conn.apply_peer_params(peer_params);
        conn
    }

    fn apply_peer_params(&mut self, params: TransportParams) {
        self.peer_params = Some(params);
        self.streams.set_peer_limits(PeerLimits {
            max_streams: params.max_streams,
            stream_window: params.stream_window,
            connection_window: params.connection_window,
        });
        self.fec = Some(Box::new(Fec::new(&self.config, self.max_datagram())));
    }

    /// Changes what this side sends of forward error correction (the receiving side
    /// needs no setting): from the next block on.
    pub fn set_fec(&mut self, mode: FecMode, max_overhead: f64) {
        let config = Arc::make_mut(&mut self.config);
        config.fec = mode;
        config.fec_max_overhead = max_overhead;
        if let Some(fec) = &mut self.fec {
            fec.configure(mode, max_overhead);
        }
    }

    /// The handshake's own parameters payload.
    fn local_params(&self) -> TransportParams {
        TransportParams::from_config(&self.config)
    }

    fn max_datagram(&self) -> usize {
        let peer = self.peer_params.map_or(u64::MAX, |p| p.max_datagram);
        u64::from(self.config.max_datagram).min(peer) as usize
    }

    fn idle_timeout(&self) -> Duration {
        let peer = self.peer_params.map_or(Duration::MAX, |p| {
            if p.idle_timeout.is_zero() {
                Duration::MAX
            } else {
                p.idle_timeout
            }
        });
        self.config.idle_timeout.min(peer)
    }

    fn peer_max_ack_delay(&self) -> Duration {
        self.peer_params
            .map_or(self.config.max_ack_delay, |p| p.max_ack_delay)
    }

    fn become_established(&mut self, now: Instant) {
        self.state = State::Established;
        let params = PathParams {
            max_datagram: self.max_datagram() as u64,
            initial_rtt: self.rtt.smoothed(),
            peer_ack_delay: self.peer_max_ack_delay(),
            hint: self.hint,
        };
        self.controller = Some(self.config.congestion.build(now, &params));
        self.events.push_back(Event::Connected);
        // The initiator's first data packet confirms the keys to the responder.
        self.ping_pending = true;
    }

    // ---- Getters ----------------------------------------------------------------------------

    pub fn remote_address(&self) -> SocketAddr {
        self.remote
    }

    pub fn peer_key(&self) -> PublicKey {
        self.peer
    }

    /// This side's connection id (the one the peer writes in its packets).
    pub fn local_id(&self) -> u32 {
        self.local_id
    }

    /// When an authenticated packet last arrived from the peer (or the connection started).
    /// The peer sends at least a PING every [`TransportConfig::keepalive`], so a gap much
    /// longer than that means the peer or the path is down.
    pub fn last_heard(&self) -> Instant {
        self.last_heard
    }

    pub fn is_established(&self) -> bool {
        matches!(self.state, State::Established)
    }

    /// Whether the connection is over and can be dropped.
    pub fn is_drained(&self) -> bool {
        matches!(self.state, State::Drained)
    }

    pub fn rtt(&self) -> &RttEstimator {
        &self.rtt
    }

    pub fn stats(&self) -> ConnectionStats {
        ConnectionStats {
            smoothed_rtt: self.rtt.smoothed(),
            min_rtt: self.rtt.min(),
            congestion: self.controller.as_ref().map(|c| c.state()),
            fec: self.fec.as_ref().map(|f| f.stats()).unwrap_or_default(),
            ..self.stats
        }
    }

    /// What a later connection to this peer may start from.
    pub fn path_hint(&self) -> Option<PathHint> {
        self.controller.as_ref()?.path_hint()
    }

    /// Bytes sent and not yet acknowledged or declared lost.
    pub fn bytes_in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Streams open (including closing ones).
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    // ---- Application calls ------------------------------------------------------------------

    pub fn poll_event(&mut self) -> Option<Event> {
        if let Some(event) = self.events.pop_front() {
            return Some(event);
        }
        self.streams.poll_event().map(|e| match e {
            StreamEvent::Opened(id) => Event::StreamOpened(id),
            StreamEvent::Readable(id) => Event::StreamReadable(id),
            StreamEvent::Writable(id) => Event::StreamWritable(id),
            StreamEvent::Reset { id, code } => Event::StreamReset { id, code },
        })
    }

    /// Opens a stream carrying `meta`. Streams can be opened once the connection is
    /// established.
    pub fn open_stream(&mut self, meta: StreamMeta) -> Result<StreamId, StreamError> {
        if !self.can_carry_streams() {
            return Err(StreamError::TooManyStreams);
        }
        self.streams.open(meta)
    }

    fn can_carry_streams(&self) -> bool {
        self.peer_params.is_some()
            && matches!(
                self.state,
                State::Established | State::AwaitingConfirmation { .. }
            )
    }

    pub fn stream_meta(&self, id: StreamId) -> Option<&StreamMeta> {
        self.streams.meta(id)
    }

    /// Writes as much of `data` as the stream's buffer takes; `Err(Blocked)` when none fits
    /// (a [`Event::StreamWritable`] follows when room frees up).
    pub fn write(&mut self, id: StreamId, data: &[u8]) -> Result<usize, StreamError> {
        self.streams.write(id, data)
    }

    /// Ends the stream's sending direction after what was written (a half-close).
    pub fn finish(&mut self, id: StreamId) -> Result<(), StreamError> {
        self.streams.finish(id)
    }

    /// Reads stream data: `Ok(Some(n))`, `Ok(None)` at the end, `Err(Blocked)` when nothing is
    /// there yet (a [`Event::StreamReadable`] follows).
    pub fn read(&mut self, id: StreamId, buf: &mut [u8]) -> Result<Option<usize>, StreamError> {
        self.streams.read(id, buf)
    }

    /// Reading freed receive window that the peer has not been told of yet: a driver that
    /// sleeps until the next transmit should look at this connection now.
    pub fn credit_pending(&self) -> bool {
        self.streams.credit_queued()
    }

    /// Whether `read` would return something now (data or the end).
    pub fn is_readable(&self, id: StreamId) -> bool {
        self.streams.readable(id)
    }

    /// How many bytes `read` would return now (contiguous data not yet read).
    pub fn readable_bytes(&self, id: StreamId) -> usize {
        self.streams.readable_bytes(id)
    }

    /// Aborts a stream in both directions; the peer gets [`Event::StreamReset`].
    pub fn reset(&mut self, id: StreamId, code: u64) -> Result<(), StreamError> {
        self.streams.reset(id, code)
    }

    /// Sets a stream's priority, weight and rate cap.
    pub fn set_schedule(&mut self, id: StreamId, schedule: Schedule) -> Result<(), StreamError> {
        self.streams.set_schedule(id, schedule)
    }

    /// Queues a control message for the peer: reliable, delivered in order, at most
    /// [`MAX_CONTROL_LEN`] bytes, at most [`MAX_CONTROL_MESSAGES`] outstanding.
    pub fn send_control(&mut self, message: &[u8]) -> Result<(), ControlError> {
        if message.len() > MAX_CONTROL_LEN {
            return Err(ControlError::TooLong);
        }
        if self.control.outgoing.len() >= MAX_CONTROL_MESSAGES {
            return Err(ControlError::Blocked);
        }
        if !self.can_carry_streams() {
            return Err(ControlError::NotConnected);
        }
        let seq = self.control.next_seq;
        self.control.next_seq += 1;
        self.control.outgoing.insert(seq, message.to_vec());
        self.control.queued.push_back(seq);
        Ok(())
    }

    /// Closes the connection: the peer is told with `code` and `reason`.
    pub fn close(&mut self, now: Instant, code: u64, reason: &[u8]) {
        match self.state {
            State::Closing { .. } | State::Draining { .. } | State::Drained => return,
            State::Handshake(_) => {
                self.state = State::Drained;
                return;
            }
            State::AwaitingConfirmation { .. } | State::Established => {}
        }
        let reason = &reason[..reason.len().min(frame::MAX_REASON_LEN)];
        self.close_frame = Some((code, reason.to_vec()));
        self.close_resend = true;
        self.state = State::Closing {
            until: now + self.rtt.pto_base() * 3,
        };
        self.events
            .push_back(Event::ConnectionLost(ConnectionError::LocallyClosed));
    }

    fn protocol_violation(&mut self, now: Instant, reason: String) {
        tracing::debug!(%reason, "closing on protocol violation");
        self.close(now, CLOSE_PROTOCOL_VIOLATION, reason.as_bytes());
        if let Some(Event::ConnectionLost(e)) = self.events.back_mut() {
            *e = ConnectionError::ProtocolViolation(reason);
        }
    }

    /// Ends this connection because the endpoint accepted a newer one from the same peer
    /// ([`crate::DatagramEvent::NewConnection`] names it in `replaces`).
    pub fn replaced(&mut self) {
        self.state = State::Drained;
        self.events
            .push_back(Event::ConnectionLost(ConnectionError::Replaced));
    }

    // ---- Timers -----------------------------------------------------------------------------

    /// When `handle_timeout` must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.state {
            State::Drained => return None,
            State::Closing { until } | State::Draining { until } => return Some(*until),
            State::Handshake(init) => {
                return Some(init.next_attempt.unwrap_or(init.created));
            }
            State::AwaitingConfirmation { .. } | State::Established => {}
        }
        let idle = self.last_heard + self.idle_timeout();
        let mut next = idle;
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                next = next.min(t);
            }
        };
        consider(self.loss_or_pto_deadline());
        consider(self.ack_deadline);
        if self.is_established() {
            // Once a PING is pending the keepalive has done its part; the PING leaves when
            // the pacer and the window let it.
            if !self.ping_pending {
                consider(Some(self.last_sent + self.config.keepalive));
            }
            if self.wants_to_send_data() && self.window_room() > 0 {
                consider(self.pacer.next());
            }
            consider(self.streams.next_unthrottle());
            consider(self.fec.as_ref().and_then(|f| f.deadline()));
        }
        Some(next)
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        match &mut self.state {
            State::Drained => return,
            State::Closing { until } | State::Draining { until } => {
                if now >= *until {
                    self.state = State::Drained;
                }
                return;
            }
            State::Handshake(init) => {
                if init.next_attempt.is_some_and(|t| now >= t) {
                    if init.attempts >= self.config.handshake_attempts {
                        self.state = State::Drained;
                        self.events
                            .push_back(Event::ConnectionLost(ConnectionError::HandshakeTimedOut));
                    } else {
                        // Send a fresh initiation (new ephemeral key, new timestamp).
                        init.next_attempt = Some(now);
                        init.handshake = None;
                    }
                }
                return;
            }
            State::AwaitingConfirmation { .. } | State::Established => {}
        }
        if now >= self.last_heard + self.idle_timeout() {
            self.state = State::Drained;
            self.events
                .push_back(Event::ConnectionLost(ConnectionError::TimedOut));
            return;
        }
        if self.loss_or_pto_deadline().is_some_and(|t| now >= t) {
            self.on_loss_timeout(now);
            if self.is_black_hole(now) {
                tracing::warn!(
                    max_datagram = self.max_datagram(),
                    "full-size packets are not getting through; closing"
                );
                self.close(now, CLOSE_PATH_BLACK_HOLE, b"path black hole");
                if let Some(Event::ConnectionLost(e)) = self.events.back_mut() {
                    *e = ConnectionError::PathBlackHole;
                }
                return;
            }
        }
        if self.is_established() && now >= self.last_sent + self.config.keepalive {
            self.ping_pending = true;
        }
        if let Some(fec) = &mut self.fec {
            fec.on_timeout(now);
        }
    }

    /// Whether full-size packets have stopped getting through: none acknowledged for
    /// [`BLACK_HOLE_AFTER`] though [`BLACK_HOLE_PACKETS`] were sent, while the peer was heard
    /// from (so the path itself is up). Checked when a probe timeout fires, which keeps
    /// happening while they vanish.
    fn is_black_hole(&self, now: Instant) -> bool {
        self.large_unacked.is_some_and(|large| {
            now >= large.since + BLACK_HOLE_AFTER
                && large.sent >= BLACK_HOLE_PACKETS
                && self.last_heard > large.since
        })
    }

    fn loss_or_pto_deadline(&self) -> Option<Instant> {
        if self.loss_time.is_some() {
            return self.loss_time;
        }
        if self.eliciting_in_flight == 0 {
            return None;
        }
        let last = self.last_eliciting_sent?;
        let pto = self.rtt.pto_base() + self.peer_max_ack_delay();
        Some(last + pto * (1 << self.pto_count.min(10)))
    }

    fn on_loss_timeout(&mut self, now: Instant) {
        if self.loss_time.is_some() {
            self.detect_lost(now);
            self.report_lost(now);
            return;
        }
        // Probe timeout: the tail went unacknowledged. Send up to two probes, which elicit an
        // ACK that shows what was lost.
        self.pto_count += 1;
        self.stats.pto_count += 1;
        self.probes = 2;
        self.ping_pending = true;
        if self.pto_count == PERSISTENT_CONGESTION_PTOS {
            if let Some(c) = &mut self.controller {
                c.on_persistent_congestion(now);
            }
        }
    }

    // ---- Receiving --------------------------------------------------------------------------

    /// Processes one datagram addressed to this connection. Datagrams that fail
    /// authentication or replay checks are dropped silently.
    pub fn handle_datagram(&mut self, now: Instant, from: SocketAddr, datagram: &mut [u8]) {
        let Ok(header) = Header::parse(datagram) else {
            return;
        };
        match header {
            Header::Initiation { .. } => {}
            Header::Response { .. } => self.handle_response(now, datagram),
            Header::Data(h) => {
                self.handle_data(now, from, h, datagram);
                if h.protected {
                    self.handle_recovered(now);
                }
            }
            Header::Parity { .. } => {
                if !self.is_established() {
                    return;
                }
                if let Some(fec) = &mut self.fec {
                    fec.on_parity(&datagram[PARITY_HEADER_LEN..]);
                    self.handle_recovered(now);
                }
            }
        }
    }

    /// Processes the packets FEC rebuilt as if they had arrived, and reports those that
    /// authenticate.
    fn handle_recovered(&mut self, now: Instant) {
        let mut buf = std::mem::take(&mut self.recovered_buf);
        buf.resize(self.max_datagram(), 0);
        let local_id = self.local_id;
        while let Some((pn, len)) = self
            .fec
            .as_mut()
            .and_then(|f| f.pop_recovered(local_id, &mut buf))
        {
            let Ok(Header::Data(h)) = Header::parse(&buf[..len]) else {
                continue;
            };
            if h.number != pn || h.receiver != self.local_id {
                continue;
            }
            let remote = self.remote;
            if self.handle_data(now, remote, h, &mut buf[..len]) {
                if let Some(fec) = &mut self.fec {
                    fec.on_recovered(pn, ACK_RANGES_KEPT);
                }
                // Acknowledge at once: the sender holds the packet's loss verdict for about
                // one RTT after the parity, no longer. (A rebuilt ACK-only packet asks for
                // nothing: a deadline without an ACK due would never be cleared.)
                if self.unacked_eliciting > 0 {
                    self.ack_deadline = Some(now);
                }
            }
        }
        self.recovered_buf = buf;
    }

    fn handle_response(&mut self, now: Instant, datagram: &mut [u8]) {
        let State::Handshake(init) = &mut self.state else {
            return;
        };
        let Some(hs) = init.handshake.take() else {
            return;
        };
        let sent_at = init.sent_at;
        let message = &datagram[crate::packet::RESPONSE_HEADER_LEN..];
        // Padded (see `transmit_initiation`): as long as the message.
        let mut payload = vec![0u8; message.len()];
        let (keys, n) = match crypto::finish(hs, message, &mut payload) {
            Ok(done) => done,
            Err(e) => {
                // A forged or corrupted response; the real one may still come.
                tracing::trace!(error = %e, "handshake response rejected");
                self.stats.auth_failures += 1;
                return;
            }
        };
        // The responder's id is taken from the authenticated payload, not the cleartext header.
        let mut r = Reader::new(&payload[..n]);
        let parsed = r
            .u32()
            .map_err(ParamsError::from)
            .and_then(|id| Ok((id, TransportParams::parse(&mut r)?)));
        let (sender, params) = match parsed {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "peer sent bad transport parameters");
                self.state = State::Drained;
                self.events
                    .push_back(Event::ConnectionLost(ConnectionError::ProtocolViolation(
                        e.to_string(),
                    )));
                return;
            }
        };
        if let Some(sent) = sent_at {
            self.rtt
                .update(now.saturating_duration_since(sent), Duration::ZERO);
        }
        self.remote_id = sender;
        self.keys = Some(keys);
        self.apply_peer_params(params);
        self.last_heard = now;
        self.become_established(now);
    }

    /// Processes a data packet; returns whether it authenticated.
    fn handle_data(
        &mut self,
        now: Instant,
        from: SocketAddr,
        h: DataHeader,
        datagram: &mut [u8],
    ) -> bool {
        if matches!(self.state, State::Drained | State::Handshake(_)) {
            return false;
        }
        let Some(keys) = &mut self.keys else {
            return false;
        };
        if datagram.len() < DATA_HEADER_LEN + TAG_LEN {
            return false;
        }
        if !self.replay.check(h.number) {
            self.stats.replays += 1;
            return false;
        }
        if h.protected {
            // Decryption works in place: keep the sealed packet for the block's repair.
            if let Some(fec) = &mut self.fec {
                fec.stage(h.number, datagram);
            }
        }
        let (header, rest) = datagram.split_at_mut(DATA_HEADER_LEN);
        let (payload, tag) = rest.split_at_mut(rest.len() - TAG_LEN);
        if !keys.open(now, h.key_phase, h.number, header, payload, tag) {
            self.stats.auth_failures += 1;
            return false;
        }
        self.replay.accept(h.number);
        if h.protected {
            if let Some(fec) = &mut self.fec {
                fec.commit(h.number);
            }
        }
        self.stats.packets_received += 1;
        self.stats.bytes_received += datagram.len() as u64;
        self.last_heard = now;
        let newest = self.largest_received.is_none_or(|(n, _)| h.number > n);
        if newest && from != self.remote {
            // The peer moved (NAT rebinding, failover); it proved itself by authenticating.
            tracing::debug!(old = %self.remote, new = %from, "peer address changed");
            self.remote = from;
        }
        if let State::AwaitingConfirmation { sent_at, .. } = self.state {
            if let Some(sent) = sent_at {
                self.rtt
                    .update(now.saturating_duration_since(sent), Duration::ZERO);
            }
            self.become_established(now);
            self.ping_pending = false;
        }
        if let State::Closing { .. } = self.state {
            // Answer whatever the peer still sends with the CLOSE again.
            self.close_resend = true;
            return true;
        }
        let payload = &datagram[DATA_HEADER_LEN..datagram.len() - TAG_LEN];
        let mut eliciting = false;
        for frame in Frames::new(payload) {
            let frame = match frame {
                Ok(f) => f,
                Err(e) => {
                    self.protocol_violation(now, e.to_string());
                    return true;
                }
            };
            eliciting |= !matches!(
                frame,
                Frame::Ack(_) | Frame::Recovered(_) | Frame::Padding | Frame::Close { .. }
            );
            if let Err(reason) = self.handle_frame(now, frame) {
                self.protocol_violation(now, reason);
                return true;
            }
            if matches!(self.state, State::Draining { .. }) {
                return true;
            }
        }
        self.on_packet_received(now, h.number, eliciting);
        true
    }

    fn handle_frame(&mut self, now: Instant, frame: Frame<'_>) -> Result<(), String> {
        match frame {
            Frame::Padding | Frame::Ping => {}
            Frame::Ack(ack) => self.on_ack_frame(now, &ack)?,
            Frame::Recovered(ranges) => self.on_recovered_frame(&ranges)?,
            Frame::Close { code, reason } => {
                self.state = State::Draining {
                    until: now + self.rtt.pto_base() * 3,
                };
                self.events
                    .push_back(Event::ConnectionLost(ConnectionError::PeerClosed {
                        code,
                        reason: String::from_utf8_lossy(reason).into_owned(),
                    }));
            }
            Frame::MaxData(max) => self.streams.on_max_data(max),
            Frame::MaxStreamData { id, max } => self
                .streams
                .on_max_stream_data(id, max)
                .map_err(|e| e.to_string())?,
            Frame::MaxStreams(max) => self.streams.on_max_streams(max),
            Frame::Control { seq, data } => self.on_control(seq, data)?,
            Frame::Open { id, meta } => {
                self.streams.on_open(id, meta).map_err(|e| e.to_string())?
            }
            Frame::Reset {
                id,
                code,
                final_size,
            } => self
                .streams
                .on_reset(id, code, final_size)
                .map_err(|e| e.to_string())?,
            Frame::Stream(f) => self.streams.on_stream(&f).map_err(|e| e.to_string())?,
        }
        Ok(())
    }

    fn on_control(&mut self, seq: u64, data: &[u8]) -> Result<(), String> {
        let c = &mut self.control;
        if seq < c.expected || c.early.contains_key(&seq) {
            return Ok(());
        }
        if data.len() > MAX_CONTROL_LEN || seq >= c.expected + MAX_CONTROL_MESSAGES as u64 {
            return Err("control message beyond the allowed window".into());
        }
        c.early.insert(seq, data.to_vec());
        while let Some(message) = c.early.remove(&c.expected) {
            c.expected += 1;
            self.events.push_back(Event::Control(message));
        }
        Ok(())
    }

    /// Records a received packet number and decides when to acknowledge it.
    fn on_packet_received(&mut self, now: Instant, number: u64, eliciting: bool) {
        let gap = self
            .largest_received
            .is_some_and(|(largest, _)| number > largest + 1 || number < largest);
        self.received.insert(number..number + 1);
        self.received.keep_highest(ACK_RANGES_KEPT);
        if self.largest_received.is_none_or(|(n, _)| number > n) {
            self.largest_received = Some((number, now));
        }
        if !eliciting {
            return;
        }
        self.unacked_eliciting += 1;
        let mut deadline = now + self.ack_delay();
        if self.unacked_eliciting >= self.config.ack_every {
            deadline = now;
        }
        if gap {
            // A hole (or a late packet filling one): tell the sender soon, but not more often
            // than once per NAK interval.
            let nak_at = self
                .last_ack_sent
                .map_or(now, |t| (t + self.nak_interval()).max(now));
            deadline = deadline.min(nak_at);
        }
        self.ack_deadline = Some(self.ack_deadline.map_or(deadline, |d| d.min(deadline)));
    }

    /// How long an ACK may wait: a quarter of the RTT, within [5 ms, max_ack_delay].
    fn ack_delay(&self) -> Duration {
        (self.rtt.smoothed() / 4).clamp(
            Duration::from_millis(5).min(self.config.max_ack_delay),
            self.config.max_ack_delay,
        )
    }

    /// The least time between two ACKs sent early for gaps: an eighth of the RTT, at least
    /// 1 ms. At most eight NAK-triggered ACKs per RTT, however many packets are lost.
    fn nak_interval(&self) -> Duration {
        (self.rtt.smoothed() / 8).max(GRANULARITY)
    }

    // ---- Acknowledgements and loss ------------------------------------------------------------

    /// The peer rebuilt these packets from parity: mark them, so that their acknowledgement
    /// (in the ACK frame that follows) counts them as losses too.
    fn on_recovered_frame(&mut self, ranges: &frame::Ack) -> Result<(), String> {
        if ranges.largest() >= self.next_pn {
            return Err(format!("RECOVERED of unsent packet {}", ranges.largest()));
        }
        for range in ranges.ranges() {
            let lo = (*range.start()).max(self.sent_base);
            for pn in lo..=*range.end() {
                let index = (pn - self.sent_base) as usize;
                if let Some(Some(packet)) = self.sent.get_mut(index) {
                    packet.recovered = true;
                }
            }
        }
        Ok(())
    }

    fn on_ack_frame(&mut self, now: Instant, ack: &frame::Ack) -> Result<(), String> {
        let largest = ack.largest();
        if largest >= self.next_pn {
            return Err(format!("ACK of unsent packet {largest}"));
        }
        let mut acked_bytes = 0;
        let mut acked_packets = 0;
        let mut rtt_sample = None;
        let mut largest_newly_acked = false;
        for range in ack.ranges() {
            let lo = (*range.start()).max(self.sent_base);
            let hi = *range.end();
            if hi < lo {
                continue;
            }
            for pn in lo..=hi {
                let index = (pn - self.sent_base) as usize;
                let Some(packet) = self.sent.get_mut(index).and_then(Option::take) else {
                    continue;
                };
                if pn == largest {
                    largest_newly_acked = true;
                    if packet.eliciting {
                        rtt_sample = Some(now.saturating_duration_since(packet.time));
                    }
                }
                acked_packets += 1;
                if packet.size > BASE_DATAGRAM {
                    self.large_unacked = None;
                }
                let bytes = u64::from(packet.size) + u64::from(packet.parity_bytes);
                acked_bytes += bytes;
                self.in_flight -= u64::from(packet.parity_bytes);
                if packet.eliciting {
                    self.in_flight -= u64::from(packet.size);
                    self.eliciting_in_flight -= 1;
                    self.delivery
                        .on_acked(now, bytes, packet.time, &packet.snapshot);
                }
                if let Some(fec) = &mut self.fec {
                    fec.on_outcome(pn, packet.recovered);
                    if packet.recovered {
                        fec.on_peer_recovered();
                        self.recovered_scratch.push(LostPacket {
                            number: pn,
                            bytes: u64::from(packet.size),
                            sent: packet.time,
                        });
                    }
                }
                for frame in &packet.frames {
                    match *frame {
                        SentFrame::Stream(f) => self.streams.on_acked(f),
                        SentFrame::Control(seq) => {
                            self.control.outgoing.remove(&seq);
                        }
                    }
                }
                self.recycle(packet.frames);
            }
        }
        self.trim_sent();
        if acked_packets == 0 {
            return Ok(());
        }
        if self.largest_acked.is_none_or(|l| largest > l) {
            self.largest_acked = Some(largest);
        }
        if let (Some(sample), true) = (rtt_sample, largest_newly_acked) {
            let delay = Duration::from_micros(ack.delay_us).min(self.peer_max_ack_delay());
            self.rtt.update(sample, delay);
        }
        // The controller reads queueing from RTT samples, and the time the peer held this ACK
        // is not queueing: with a few packets in flight a receiver holds ACKs up to its
        // max_ack_delay, as much as a quarter of the RTT, which once read as a full queue.
        // (Subtracted as RttEstimator does: never below the minimum.)
        let rtt_sample = rtt_sample.map(|sample| {
            let delay = Duration::from_micros(ack.delay_us).min(self.peer_max_ack_delay());
            sample.saturating_sub(delay).max(self.rtt.min().min(sample))
        });
        self.pto_count = 0;
        self.detect_lost(now);
        if !self.recovered_scratch.is_empty() {
            // Rebuilt packets were lost on the path all the same: the controller judges
            // them with the others.
            self.lost_scratch.append(&mut self.recovered_scratch);
            self.lost_scratch.sort_unstable_by_key(|p| p.number);
        }
        // The controller hears of the acknowledged packets before the losses they revealed,
        // so that it judges the losses against everything this ACK delivered.
        let (prior_delivered, rate) = self
            .delivery
            .take_sample(self.rtt.min())
            .unwrap_or((self.delivery.delivered(), None));
        if let Some(controller) = &mut self.controller {
            controller.on_ack(
                now,
                &AckEvent {
                    acked_bytes,
                    acked_packets,
                    in_flight: self.in_flight,
                    rtt: &self.rtt,
                    rtt_sample,
                    rate,
                    prior_delivered,
                    delivered: self.delivery.delivered(),
                },
            );
        }
        self.report_lost(now);
        Ok(())
    }

    /// Declares lost every unacknowledged packet far enough below the largest acknowledged
    /// (RFC 9002 §6.1), and sets the timer for the ones not yet far enough.
    fn detect_lost(&mut self, now: Instant) {
        self.loss_time = None;
        let Some(largest) = self.largest_acked else {
            return;
        };
        let rtt = self.rtt.latest().max(self.rtt.smoothed());
        let loss_delay = (rtt * TIME_THRESHOLD_NUM / TIME_THRESHOLD_DEN).max(GRANULARITY);
        let lost_before = now.checked_sub(loss_delay);
        let mut lost = std::mem::take(&mut self.lost_scratch);
        lost.clear();
        let end = largest.min(self.next_pn.saturating_sub(1));
        let mut pn = self.sent_base;
        while pn < end {
            let index = (pn - self.sent_base) as usize;
            if let Some(packet) = &self.sent[index] {
                // A protected packet counts from its block's parity: the receiver may still
                // rebuild it.
                let repair = self.fec.as_ref().map_or(Repair::None, |f| f.repair(pn));
                let (from_pn, from_time) = match repair {
                    Repair::None => (pn, packet.time),
                    Repair::Pending => {
                        pn += 1;
                        continue;
                    }
                    Repair::After { pn: after, time } => {
                        (after.saturating_sub(1).max(pn), time.max(packet.time))
                    }
                };
                let by_count = largest >= from_pn && largest - from_pn >= PACKET_THRESHOLD;
                let by_time = lost_before.is_some_and(|t| from_time <= t);
                if by_count || by_time {
                    let packet = self.sent[index].take().expect("checked above");
                    self.on_packet_lost(pn, packet, &mut lost);
                } else {
                    let at = from_time + loss_delay;
                    self.loss_time = Some(self.loss_time.map_or(at, |t| t.min(at)));
                }
            }
            pn += 1;
        }
        self.trim_sent();
        self.lost_scratch = lost;
    }

    /// Tells the controller about the packets the last [`Self::detect_lost`] declared lost.
    fn report_lost(&mut self, now: Instant) {
        if self.lost_scratch.is_empty() {
            return;
        }
        if let Some(controller) = &mut self.controller {
            let verdict = controller.on_loss(
                now,
                &LossEvent {
                    lost: &self.lost_scratch,
                    in_flight: self.in_flight,
                    rtt: &self.rtt,
                },
            );
            // A queue overflowing is not the path's own loss: FEC must not buy parity
            // against it. (Clustered losses may be the line's bursts, which FEC is for.)
            if verdict == LossVerdict::Overflow {
                if let Some(fec) = &mut self.fec {
                    fec.on_overflow(self.next_pn);
                }
            }
        }
        self.lost_scratch.clear();
    }

    fn on_packet_lost(&mut self, number: u64, packet: SentPacket, lost: &mut Vec<LostPacket>) {
        self.stats.packets_lost += 1;
        self.stats.bytes_lost += u64::from(packet.size);
        self.in_flight -= u64::from(packet.parity_bytes);
        if let Some(fec) = &mut self.fec {
            fec.on_outcome(number, true);
        }
        if packet.eliciting {
            self.in_flight -= u64::from(packet.size);
            self.eliciting_in_flight -= 1;
            lost.push(LostPacket {
                number,
                bytes: u64::from(packet.size),
                sent: packet.time,
            });
        }
        for frame in &packet.frames {
            match *frame {
                SentFrame::Stream(f) => self.streams.on_lost(f),
                SentFrame::Control(seq) => {
                    if self.control.outgoing.contains_key(&seq) {
                        self.control.queued.push_back(seq);
                    }
                }
            }
        }
        self.recycle(packet.frames);
    }

    fn recycle(&mut self, mut frames: Vec<SentFrame>) {
        if frames.capacity() > 0 && self.spare_frame_lists.len() < 1024 {
            frames.clear();
            self.spare_frame_lists.push(frames);
        }
    }

    /// Drops acknowledged and lost packets from the front of the sent list.
    fn trim_sent(&mut self) {
        while let Some(None) = self.sent.front() {
            self.sent.pop_front();
            self.sent_base += 1;
        }
        if let Some(fec) = &mut self.fec {
            fec.forget_below(self.sent_base);
        }
    }

    // ---- Sending ------------------------------------------------------------------------------

    fn window_room(&self) -> u64 {
        let window = self.controller.as_ref().map_or(0, |c| c.window());
        window.saturating_sub(self.in_flight)
    }

    fn pacing_rate(&self) -> u64 {
        let rate = self.controller.as_ref().map_or(0, |c| c.pacing_rate());
        match self.config.max_rate {
            Some(cap) => rate.min(cap),
            None => rate,
        }
    }

    fn wants_to_send_data(&self) -> bool {
        self.fec.as_ref().is_some_and(|f| f.has_parity())
            || self.ping_pending
            || self.probes > 0
            || !self.control.queued.is_empty()
            || self.streams.has_pending()
    }

    fn ack_due(&self, now: Instant) -> bool {
        self.unacked_eliciting > 0 && self.ack_deadline.is_some_and(|d| d <= now)
    }

    /// Builds the next datagrams to send into `buf`, if any are due. `buf` should hold
    /// [`TransportConfig::max_burst_packets`] datagrams of [`TransportConfig::max_datagram`]
    /// bytes; fewer are built when it is smaller.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        match &mut self.state {
            State::Drained | State::Draining { .. } => None,
            State::Handshake(_) => self.transmit_initiation(now, buf),
            State::AwaitingConfirmation { response, sent_at } => {
                let response = response.take()?;
                *sent_at = Some(now);
                let size = response.len().min(buf.len());
                buf[..size].copy_from_slice(&response[..size]);
                Some(self.single_datagram(now, size))
            }
            State::Closing { .. } => {
                if !self.close_resend {
                    return None;
                }
                self.close_resend = false;
                self.transmit_close(now, buf)
            }
            State::Established => self.transmit_packets(now, buf),
        }
    }

    /// Counts one unpaced datagram of `size` bytes, built at the start of the buffer, and
    /// describes it for the driver.
    fn single_datagram(&mut self, now: Instant, size: usize) -> Transmit {
        self.count_sent(now, size);
        Transmit {
            destination: self.remote,
            size,
            segment_size: None,
            departure: now,
        }
    }

    fn count_sent(&mut self, now: Instant, size: usize) {
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += size as u64;
        self.last_sent = now;
    }

    fn transmit_initiation(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let params = self.local_params();
        let State::Handshake(init) = &mut self.state else {
            return None;
        };
        if init.handshake.is_some() || init.next_attempt.is_some_and(|t| now < t) {
            return None;
        }
        // Payload: the wall-clock timestamp (replay protection), then our parameters, then
        // zeros to make the initiation as long as our data packets will be: a path that
        // cannot carry them fails the handshake, rather than establishing a tunnel whose
        // data vanishes (the socket sets don't-fragment).
        let padded = usize::from(self.config.max_datagram)
            .saturating_sub(INITIATION_HEADER_LEN + crypto::INITIATION_OVERHEAD);
        let mut payload = vec![0u8; padded.max(8 + PARAMS_MAX_LEN)];
        let mut w = Writer::new(&mut payload);
        let elapsed = now.saturating_duration_since(init.created);
        w.u64((init.unix_base + elapsed).as_nanos() as u64);
        params.emit(&mut w);
        let payload_len = w.len().max(padded);
        let mut header = [0u8; INITIATION_HEADER_LEN];
        Header::Initiation {
            sender: self.local_id,
        }
        .emit(&mut Writer::new(&mut header));
        buf[..INITIATION_HEADER_LEN].copy_from_slice(&header);
        let noise = &mut buf[INITIATION_HEADER_LEN..];
        let (hs, n) = match crypto::initiate(
            &init.secret,
            &self.peer,
            &header,
            &payload[..payload_len],
            noise,
        ) {
            Ok(done) => done,
            Err(e) => {
                // Only a malformed key can fail here, and keys are checked when parsed.
                tracing::error!(error = %e, "cannot build a handshake initiation");
                self.state = State::Drained;
                return None;
            }
        };
        init.handshake = Some(hs);
        init.sent_at = Some(now);
        init.next_attempt = Some(now + HANDSHAKE_RETRY * (1 << init.attempts.min(16)));
        init.attempts += 1;
        Some(self.single_datagram(now, INITIATION_HEADER_LEN + n))
    }

    fn transmit_close(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let (code, reason) = self.close_frame.clone()?;
        if let Some(fec) = &mut self.fec {
            // Blocks are runs of consecutive packets; the CLOSE is not one of them.
            fec.close_block();
        }
        let size = self.seal_packet(now, buf, |w| frame::emit_close(w, code, &reason))?;
        Some(self.single_datagram(now, size))
    }

    /// Writes one packet into `buf` with frames from `fill`, encrypts it, and returns its size.
    fn seal_packet(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        fill: impl FnOnce(&mut Writer<'_>),
    ) -> Option<usize> {
        let max = self.max_datagram().min(buf.len());
        let payload_len = {
            let mut w = Writer::new(&mut buf[DATA_HEADER_LEN..max - TAG_LEN]);
            fill(&mut w);
            w.len()
        };
        if payload_len == 0 {
            return None;
        }
        Some(self.encrypt(now, buf, payload_len, false))
    }

    /// Writes the header for the next packet number and encrypts the payload already in
    /// `buf[DATA_HEADER_LEN..][..payload_len]`. Returns the packet size.
    fn encrypt(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        payload_len: usize,
        protected: bool,
    ) -> usize {
        let keys = self
            .keys
            .as_mut()
            .expect("established connections have keys");
        let number = self.next_pn;
        self.next_pn += 1;
        let key_phase = keys.send_phase(now);
        Header::Data(DataHeader {
            receiver: self.remote_id,
            key_phase,
            protected,
            number,
        })
        .emit(&mut Writer::new(&mut buf[..DATA_HEADER_LEN]));
        let (header, rest) = buf.split_at_mut(DATA_HEADER_LEN);
        let tag = keys.seal(number, header, &mut rest[..payload_len]);
        rest[payload_len..payload_len + TAG_LEN].copy_from_slice(&tag);
        DATA_HEADER_LEN + payload_len + TAG_LEN
    }

    fn transmit_packets(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let max = self.max_datagram();
        let slots = self.config.max_burst_packets.min(buf.len() / max);
        if slots == 0 {
            return None;
        }
        if self.fec.as_ref().is_some_and(|f| f.has_parity()) && self.pacer.delay(now).is_none() {
            // Parity first: it repairs packets already on their way.
            return self.transmit_parity(now, buf);
        }
        let ack_due = self.ack_due(now);
        let probing = self.probes > 0;
        let rate = self.pacing_rate();
        let wants = self.wants_to_send_data();
        let mut data_packets = 0;
        if probing {
            data_packets = self.probes as usize;
        } else if wants && self.pacer.delay(now).is_none() {
            let room = self.window_room();
            let burst = Pacer::burst_bytes(rate, 2 * max as u64, (slots * max) as u64);
            let by_burst = burst.div_ceil(max as u64);
            let by_window = room.div_ceil(max as u64);
            data_packets = (by_burst.min(by_window) as usize).min(slots);
        }
        if data_packets == 0 && !ack_due {
            return None;
        }
        let packets = data_packets.max(usize::from(ack_due)).min(slots);
        // While FEC protects, every packet joins a block and is built to fit a shard; the
        // whole burst has that size (GSO).
        let srtt = self.rtt.smoothed();
        let next_pn = self.next_pn;
        let batch_protected = self.fec.as_mut().is_some_and(|f| {
            (data_packets > 0 || f.is_open()) && f.protect_next(now, next_pn, srtt)
        });
        let cap = match &self.fec {
            Some(f) if batch_protected => f.max_protected(),
            _ => max,
        };
        let mut size = 0;
        let mut segment = 0;
        let mut count = 0;
        let mut eliciting_bytes = 0;
        for i in 0..packets {
            let next_pn = self.next_pn;
            let protected = batch_protected
                && self
                    .fec
                    .as_mut()
                    .is_some_and(|f| f.protect_next(now, next_pn, srtt));
            let out = &mut buf[size..size + cap];
            let with_ack = i == 0 && (ack_due || self.unacked_eliciting > 0 && data_packets > 0);
            let Some((len, eliciting)) =
                self.build_packet(now, out, with_ack, i < data_packets, protected)
            else {
                break;
            };
            if count > 0 && len > segment {
                // Cannot happen: packets are built full-size until the last.
                break;
            }
            if eliciting {
                eliciting_bytes += len as u64;
            }
            size += len;
            count += 1;
            if count == 1 {
                segment = len;
            }
            if len < segment || len < cap {
                break;
            }
        }
        if count == 0 {
            return None;
        }
        let departure = self.pacer.next().map_or(now, |t| t.min(now));
        if eliciting_bytes > 0 && !probing {
            self.pacer.on_sent(now, eliciting_bytes, rate);
        }
        self.probes = self.probes.saturating_sub(count as u32);
        if !self.wants_to_send_data() && self.window_room() > 0 {
            // Out of data with room to send: rate samples now measure the application.
            self.delivery.on_app_limited(self.in_flight);
        }
        Some(Transmit {
            destination: self.remote,
            size,
            segment_size: (count > 1).then_some(segment),
            departure,
        })
    }

    /// A burst of parity packets, paced like data. Their bytes count in flight with the last
    /// packet of their block, so that they take their share of the congestion window and
    /// the delivery rate sees the whole wire.
    fn transmit_parity(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let len = self.fec.as_ref()?.parity_packet_len();
        let slots = self.config.max_burst_packets.min(buf.len() / len);
        let rate = self.pacing_rate();
        let burst = Pacer::burst_bytes(rate, 2 * len as u64, (slots * len) as u64);
        let packets = (burst.div_ceil(len as u64) as usize).clamp(1, slots.max(1));
        let mut size = 0;
        let mut count = 0;
        while count < packets && size + len <= buf.len() {
            let out = &mut buf[size..size + len];
            Header::Parity {
                receiver: self.remote_id,
            }
            .emit(&mut Writer::new(&mut out[..PARITY_HEADER_LEN]));
            let next_pn = self.next_pn;
            let fec = self.fec.as_mut()?;
            let Some((_, owner)) = fec.pop_parity(now, next_pn, &mut out[PARITY_HEADER_LEN..])
            else {
                break;
            };
            let owner = owner.and_then(|pn| pn.checked_sub(self.sent_base));
            if let Some(Some(packet)) = owner.and_then(|i| self.sent.get_mut(i as usize)) {
                packet.parity_bytes += len as u32;
                self.in_flight += len as u64;
            }
            self.count_sent(now, len);
            size += len;
            count += 1;
        }
        if count == 0 {
            return None;
        }
        let departure = self.pacer.next().map_or(now, |t| t.min(now));
        self.pacer.on_sent(now, size as u64, rate);
        if let Some(c) = &mut self.controller {
            c.on_sent(now, size as u64, self.in_flight);
        }
        Some(Transmit {
            destination: self.remote,
            size,
            segment_size: (count > 1).then_some(len),
            departure,
        })
    }

    /// Builds one packet into `out`; returns its size and whether it is ack-eliciting.
    /// A `protected` packet joins the open FEC block.
    fn build_packet(
        &mut self,
        now: Instant,
        out: &mut [u8],
        with_ack: bool,
        with_data: bool,
        protected: bool,
    ) -> Option<(usize, bool)> {
        let max = out.len();
        let mut frames = self.spare_frame_lists.pop().unwrap_or_default();
        let mut stream_frames = Vec::new();
        let mut eliciting = false;
        let mut acked = false;
        let payload_len = {
            let mut w = Writer::new(&mut out[DATA_HEADER_LEN..max - TAG_LEN]);
            if with_ack {
                if let Some((_, received_at)) = self.largest_received {
                    if let Some(fec) = &mut self.fec {
                        // Before the ACK, so that the sender marks them first.
                        fec.write_recovered(&mut w);
                    }
                    let delay = now.saturating_duration_since(received_at).as_micros() as u64;
                    acked = frame::emit_ack(&mut w, self.received.iter(), delay);
                }
            }
            if with_data {
                self.streams
                    .write_control_frames(&mut w, &mut stream_frames);
                while let Some(&seq) = self.control.queued.front() {
                    let Some(message) = self.control.outgoing.get(&seq) else {
                        self.control.queued.pop_front();
                        continue;
                    };
                    if frame::control_len(seq, message) > w.remaining() {
                        break;
                    }
                    frame::emit_control(&mut w, seq, message);
                    frames.push(SentFrame::Control(seq));
                    self.control.queued.pop_front();
                    eliciting = true;
                }
                let before = w.len();
                self.stats.stream_bytes_sent +=
                    self.streams
                        .write_stream_frames(now, &mut w, &mut stream_frames)
                        as u64;
                eliciting |= w.len() > before || !stream_frames.is_empty();
                if (self.ping_pending || self.probes > 0) && !eliciting && w.remaining() > 0 {
                    frame::emit_varint_frame(&mut w, frame::PING, &[]);
                    eliciting = true;
                }
                if eliciting {
                    self.ping_pending = false;
                }
                if w.len() > 0 && w.remaining() < PAD_BELOW {
                    let pad = w.remaining();
                    w.reserve(pad).fill(0);
                }
            }
            w.len()
        };
        frames.extend(stream_frames.into_iter().map(SentFrame::Stream));
        if payload_len == 0 {
            self.recycle(frames);
            return None;
        }
        if acked {
            self.stats.acks_sent += 1;
            self.unacked_eliciting = 0;
            self.ack_deadline = None;
            self.last_ack_sent = Some(now);
        }
        let number = self.next_pn;
        let size = self.encrypt(now, out, payload_len, protected);
        if protected {
            if let Some(fec) = &mut self.fec {
                fec.on_sealed(number, &mut out[..size]);
            }
        }
        self.count_sent(now, size);
        if !eliciting {
            self.stats.ack_only_sent += 1;
        }
        let snapshot = self.delivery.on_sent(now, self.in_flight);
        if eliciting {
            if size > usize::from(BASE_DATAGRAM) {
                match &mut self.large_unacked {
                    Some(large) => large.sent += 1,
                    None => {
                        self.large_unacked = Some(LargeUnacked {
                            since: now,
                            sent: 1,
                        })
                    }
                }
            }
            self.stats.eliciting_sent += 1;
            self.in_flight += size as u64;
            self.eliciting_in_flight += 1;
            self.last_eliciting_sent = Some(now);
            if let Some(c) = &mut self.controller {
                c.on_sent(now, size as u64, self.in_flight);
            }
        }
        debug_assert_eq!(number, self.sent_base + self.sent.len() as u64);
        self.sent.push_back(Some(SentPacket {
            time: now,
            size: size as u16,
            parity_bytes: 0,
            recovered: false,
            eliciting,
            snapshot,
            frames,
        }));
        Some((size, eliciting))
    }
}

/// Close code for protocol violations. The transport's own codes start at 0x100; the ones
/// below are the application's (`Tunnel::close`).
pub const CLOSE_PROTOCOL_VIOLATION: u64 = 0x100;

/// Close code for a path that stopped carrying full-size packets
/// ([`ConnectionError::PathBlackHole`]).
pub const CLOSE_PATH_BLACK_HOLE: u64 = 0x101;

/// Packets up to this size are taken to fit any path: the smallest `max_datagram` a peer may
/// declare. Larger ones are watched for a black hole.
const BASE_DATAGRAM: u16 = 1200;
/// A black hole is declared when no larger packet was acknowledged for this long...
const BLACK_HOLE_AFTER: Duration = Duration::from_secs(3);
/// ...while at least this many were sent (random loss, even heavy, does not lose them all)...
const BLACK_HOLE_PACKETS: u32 = 8;
// ...and the peer was heard from after the first of them left.

/// Large packets sent since the last one was acknowledged.
#[derive(Debug, Clone, Copy)]
struct LargeUnacked {
    since: Instant,
    sent: u32,
}

/// Errors of [`Connection::send_control`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    #[error("control message longer than {MAX_CONTROL_LEN} bytes")]
    TooLong,
    #[error("too many control messages outstanding")]
    Blocked,
    #[error("the connection is not established")]
    NotConnected,
}

/// The payload the responder's handshake message carries: its connection id, then its
/// parameters.
pub(crate) fn response_payload(config: &TransportConfig, local_id: u32, out: &mut [u8]) -> usize {
    let mut w = Writer::new(out);
    w.u32(local_id);
    TransportParams::from_config(config).emit(&mut w);
    w.len()
}

/// Parses an initiation's payload: the timestamp (Unix nanoseconds) and the parameters.
pub(crate) fn parse_initiation_payload(
    payload: &[u8],
) -> Result<(u64, TransportParams), ParamsError> {
    let mut r = Reader::new(payload);
    let timestamp = r.u64()?;
    let params = TransportParams::parse(&mut r)?;
    Ok((timestamp, params))
}
