//! A connection: one peer, its keys, its streams, its reliability and congestion state.
//!
//! The connection is a sans-IO state machine in the shape of quinn-proto's: the driver feeds
//! it datagrams (`handle_datagram`), expired timers (`handle_timeout`) and application calls
//! (streams, control messages), and collects what it wants to send (`poll_transmit`), when
//! it next needs waking (`poll_timeout`) and what happened (`poll_event`). Time is always an
//! argument.
//!
//! `Connection` coordinates; each concern is a sub-state machine in a room of its own:
//!
//! | room | holds |
//! |---|---|
//! | `handshake.rs` | both sides of the Noise IK handshake and its padding |
//! | `recovery.rs` | sent packets, in flight, loss and probe timeouts, black holes; the congestion controller, the FEC sender and the path MTU search |
//! | `mtu.rs` | path MTU discovery: the datagram size, probes, the fallback after a black hole |
//! | `ack.rs` | received packet numbers and when an ACK is due |
//! | `control.rs` | the reliable, ordered control channel |
//! | `fec/` | forward error correction, sending and receiving halves |
//! | `timer.rs` | the timer table `poll_timeout` and `handle_timeout` share |
//! | `receive.rs` | a datagram in: authentication, frames to their owners |
//! | `transmit.rs` | datagrams out: bursts of equal-size packets for one GSO send |
//! | `error.rs`, `params.rs` | how connections end; the handshake's transport parameters |

mod ack;
mod control;
mod error;
mod fec;
mod handshake;
mod mtu;
pub(crate) mod params;
mod receive;
mod recovery;
mod stats;
mod timer;
mod transmit;

#[cfg(any(test, feature = "driver", feature = "testing"))]
pub(crate) use transmit::send_buffer_len;

use crate::config::{FecMode, TransportConfig};
use crate::congestion::{PathHint, PathParams};
use crate::crypto::{Keys, PublicKey, SecretKey};
use crate::pacing::Pacer;
use crate::replay::ReplayWindow;
use crate::rtt::RttEstimator;
use crate::streams::{
    BUFFER_SWEEP, PeerLimits, Scheduler, StreamError, StreamEvent, StreamFrameSent, StreamLimits,
    Streams,
};
use crate::wire::frame::MAX_REASON_LEN;
use crate::wire::{StreamId, StreamMeta};
use ack::AckState;
use control::ControlChannel;
pub use control::{ControlError, MAX_CONTROL_LEN, MAX_CONTROL_MESSAGES};
pub use error::{CLOSE_PROTOCOL_VIOLATION, CLOSE_REPLACED, ConnectionError, TransportError};
pub use fec::FecStats;
use fec::{FecReceiver, FecSender};
use handshake::Initiation;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use handshake::parse_initiation_payload;
pub(crate) use handshake::{Accepted, Incoming, Rejected};
pub use mtu::MtuStats;
pub(crate) use mtu::{BASE_DATAGRAM, PathMtu};
use params::{APP_EXTENSIONS_SHIFT, EXTENSION_PUSH, TransportParams};
use recovery::{FrameOutcome, Recovery, SentFrame, Timeout};
pub use stats::ConnectionStats;
use std::collections::VecDeque;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use timer::{Timer, TimerTable};
pub use transmit::Transmit;

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

/// What every connection starts from, whichever side it is.
#[derive(Debug)]
pub(crate) struct Setup {
    pub(crate) config: Arc<TransportConfig>,
    pub(crate) now: Instant,
    /// This side's connection id.
    pub(crate) local_id: u32,
    pub(crate) remote: SocketAddr,
    pub(crate) peer: PublicKey,
    /// What an earlier connection to the same peer learned of the path.
    pub(crate) hint: Option<PathHint>,
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
    recovery: Recovery,
    pacer: Pacer,
    acks: AckState,
    streams: Streams,
    control: ControlChannel,
    /// The receiving half of FEC, once the datagram size is agreed (the sending half is in
    /// `recovery`).
    fec_receiver: Option<Box<FecReceiver>>,
    /// A PING is to be sent (keepalive, probe, or the initiator's confirmation).
    ping_pending: bool,
    /// Until when the stream scheduler holds back all the data waiting (a rate), as found
    /// by the last transmit; the pacing timer waits for it.
    held_until: Option<Instant>,
    events: VecDeque<Event>,
    last_heard: Instant,
    last_sent: Instant,
    /// When idle stream buffers are next looked for, while some hold memory.
    next_buffer_sweep: Instant,
    close_frame: Option<(u64, Vec<u8>)>,
    close_resend: bool,
    stats: ConnectionStats,
    /// Where a packet's stream frames are recorded while it is built.
    stream_frames: Vec<StreamFrameSent>,
    /// Where a rebuilt packet is processed.
    recovered_buf: Vec<u8>,
}

impl Connection {
    fn new(setup: Setup, initiator: bool, state: State) -> Self {
        let config = setup.config;
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
            push: false,
        };
        Self {
            streams: Streams::new(initiator, limits, no_credit),
            recovery: Recovery::new(
                setup.now,
                config.max_ack_delay,
                PathMtu::new(config.max_datagram, setup.remote.is_ipv6()),
            ),
            acks: AckState::new(config.ack_every, config.max_ack_delay),
            config,
            state,
            local_id: setup.local_id,
            remote_id: 0,
            remote: setup.remote,
            peer: setup.peer,
            keys: None,
            replay: ReplayWindow::default(),
            peer_params: None,
            hint: setup.hint,
            pacer: Pacer::default(),
            control: ControlChannel::default(),
            fec_receiver: None,
            ping_pending: false,
            held_until: None,
            events: VecDeque::new(),
            last_heard: setup.now,
            last_sent: setup.now,
            next_buffer_sweep: setup.now,
            close_frame: None,
            close_resend: false,
            stats: ConnectionStats::default(),
            stream_frames: Vec::new(),
            recovered_buf: Vec::new(),
        }
    }

    /// A connection that initiates the handshake. `unix_time` is the wall-clock time now
    /// (since the Unix epoch): the responder refuses initiations that are not newer than the
    /// last one it accepted from this peer, which stops replays.
    pub(crate) fn initiate(setup: Setup, unix_time: Duration, secret: SecretKey) -> Self {
        let initiation = Initiation::new(secret, setup.now, unix_time);
        Self::new(setup, true, State::Handshake(Box::new(initiation)))
    }

    /// A connection accepted from an initiation; its first datagram is the response.
    pub(crate) fn accept(setup: Setup, accepted: Accepted) -> Self {
        let state = State::AwaitingConfirmation {
            response: Some(accepted.response),
            sent_at: None,
        };
        let mut conn = Self::new(setup, false, state);
        conn.remote_id = accepted.remote_id;
        conn.keys = Some(accepted.keys);
        conn.apply_peer_params(accepted.params);
        conn
    }

    fn apply_peer_params(&mut self, params: TransportParams) {
        self.peer_params = Some(params);
        self.streams.set_peer_limits(PeerLimits {
            max_streams: params.max_streams,
            stream_window: params.stream_window,
            connection_window: params.connection_window,
            push: params.extensions & EXTENSION_PUSH != 0,
        });
        let cap = self.datagram_cap();
        self.recovery.mtu.set_cap(cap as u16);
        let fec = FecSender::new(&self.config, self.max_datagram());
        self.recovery.on_peer_params(params.max_ack_delay, fec);
        self.fec_receiver = Some(Box::new(FecReceiver::new(usize::from(BASE_DATAGRAM))));
    }

    fn become_established(&mut self, now: Instant) {
        self.state = State::Established;
        let initial_rtt = self.recovery.rtt().smoothed();
        // The operator stated the path's rate: start there, as from an earlier connection's
        // hint, instead of searching for it (a request/response exchange that never fills
        // the pipe would never find it). An overstatement is corrected as any hint is.
        let stated = self.config.max_rate.map(|rate| PathHint {
            rate,
            min_rtt: self
                .hint
                .map_or(initial_rtt, |h| h.min_rtt.min(initial_rtt)),
        });
        let params = PathParams {
            max_datagram: self.max_datagram() as u64,
            initial_rtt,
            peer_ack_delay: self.recovery.peer_max_ack_delay(),
            hint: stated.or(self.hint),
        };
        self.recovery.start(now, &self.config.congestion, params);
        self.recovery.mtu.start(now);
        self.events.push_back(Event::Connected);
        // The initiator's first data packet confirms the keys to the responder.
        self.ping_pending = true;
    }

    /// Changes what this side sends of forward error correction (the receiving side
    /// needs no setting): from the next block on.
    pub fn set_fec(&mut self, mode: FecMode, max_overhead: f64) {
        let config = Arc::make_mut(&mut self.config);
        config.fec = mode;
        config.fec_max_overhead = max_overhead;
        if let Some(fec) = &mut self.recovery.fec {
            fec.configure(mode, max_overhead);
        }
    }

    /// Hands the order in which streams send to `scheduler` (the default shares the bytes
    /// equally among streams).
    /// Lets stream `id` hold at most `limit` bytes written and not yet sent (sent bytes
    /// awaiting acknowledgment do not count): writes block beyond it, and the stream is
    /// writable again once its sending drained what it held to half (or a new limit leaves
    /// room). A shaper uses it to bound what a held-back flow
    /// queues in the gateway.
    pub fn set_unsent_limit(&mut self, id: StreamId, limit: u64) {
        self.streams.set_unsent_limit(id, limit);
    }

    /// Marks the packets that carry stream `id`'s data with `dscp` (its low six bits; 0
    /// unmarks). A burst of packets carries one DSCP, so streams of different DSCPs take
    /// separate sends.
    pub fn set_dscp(&mut self, id: StreamId, dscp: u8) {
        self.streams.set_dscp(id, dscp);
    }

    pub fn set_scheduler(&mut self, scheduler: Box<dyn Scheduler>) {
        self.streams.set_scheduler(scheduler);
    }

    /// The size packets are built to now (path MTU probes aside).
    fn max_datagram(&self) -> usize {
        usize::from(self.recovery.mtu.current())
    }

    /// The largest datagram either side allows: the most a peer's packet can be, and the
    /// most path MTU discovery tries.
    fn datagram_cap(&self) -> usize {
        let peer = self.peer_params.map_or(u64::MAX, |p| p.max_datagram);
        u64::from(self.config.max_datagram).min(peer) as usize
    }

    /// Path MTU discovery moved the datagram size: FEC codes the next block for it, and the
    /// controller counts its minimum window in it.
    fn apply_datagram_size(&mut self) {
        let Some(size) = self.recovery.mtu.take_change() else {
            return;
        };
        tracing::info!(remote = %self.remote, size, "path MTU: datagram size");
        self.recovery.on_datagram_size(usize::from(size));
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

    /// Whether everything sent on the streams (OPENs, data, FINs, resets) has been
    /// acknowledged: closing now loses nothing the application wrote. O(streams).
    pub fn is_delivered(&self) -> bool {
        self.streams.all_delivered()
    }

    pub fn is_established(&self) -> bool {
        matches!(self.state, State::Established)
    }

    /// Whether the connection is over and can be dropped.
    pub fn is_drained(&self) -> bool {
        matches!(self.state, State::Drained)
    }

    /// What the peer's application understands ([`TransportConfig::app_extensions`] on its
    /// side); 0 until the handshake has brought the peer's parameters.
    pub fn peer_app_extensions(&self) -> u32 {
        self.peer_params
            .map_or(0, |p| (p.extensions >> APP_EXTENSIONS_SHIFT) as u32)
    }

    pub fn rtt(&self) -> &RttEstimator {
        self.recovery.rtt()
    }

    pub fn stats(&self) -> ConnectionStats {
        let recovery = self.recovery.stats();
        let sent = self.recovery.fec.as_ref().map(|f| f.stats());
        let received = self.fec_receiver.as_ref().map(|f| f.stats());
        ConnectionStats {
            packets_lost: recovery.packets_lost,
            bytes_lost: recovery.bytes_lost,
            pto_count: recovery.pto_count,
            smoothed_rtt: self.rtt().smoothed(),
            min_rtt: self.rtt().min(),
            congestion: self.recovery.controller_state(),
            fec: FecStats::merge(sent.unwrap_or_default(), received.unwrap_or_default()),
            send_buffered: self.streams.send_buffered(),
            send_unsent: self.streams.send_unsent(),
            send_budget: self.recovery.send_budget(),
            receive_buffered: self.streams.receive_buffered(),
            datagram_size: self.recovery.mtu.current(),
            mtu: self.recovery.mtu.stats(),
            cipher: self.keys.as_ref().map(Keys::cipher),
            ..self.stats
        }
    }

    /// What a later connection to this peer may start from.
    pub fn path_hint(&self) -> Option<PathHint> {
        self.recovery.path_hint()
    }

    /// Bytes sent and not yet acknowledged or declared lost.
    pub fn bytes_in_flight(&self) -> u64 {
        self.recovery.in_flight()
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

    /// Streams the connection's map has room for.
    #[cfg(test)]
    pub(crate) fn stream_slots(&self) -> usize {
        self.streams.slots()
    }

    /// Memory the streams' send and receive buffers hold.
    #[cfg(test)]
    pub(crate) fn stream_buffer_bytes(&self) -> usize {
        self.streams.buffer_bytes()
    }

    /// Entries in the streams' lists of blocked writers.
    #[cfg(test)]
    pub(crate) fn blocked_listed(&self) -> usize {
        self.streams.blocked_listed()
    }

    pub fn stream_meta(&self, id: StreamId) -> Option<&StreamMeta> {
        self.streams.meta(id)
    }

    /// Writes as much of `data` as the stream's buffer takes; `Err(Blocked)` when none fits
    /// (a [`Event::StreamWritable`] follows when room frees up).
    pub fn write(&mut self, id: StreamId, data: &[u8]) -> Result<usize, StreamError> {
        self.streams.write(id, data, self.recovery.send_budget())
    }

    /// As [`Self::write`], for the bytes of `parts` one after the other (a header and
    /// the payload it announces, say, without first copying them together).
    pub fn write_vectored(
        &mut self,
        id: StreamId,
        parts: &[IoSlice<'_>],
    ) -> Result<usize, StreamError> {
        self.streams
            .write_parts(id, parts, self.recovery.send_budget())
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

    /// Whether everything up to the end of a STREAM frame its sender marked PUSH (the end of
    /// what the peer's application had written) or FIN is here and not yet read: a reader
    /// should get it without waiting for more.
    pub fn pushed(&self, id: StreamId) -> bool {
        self.streams.pushed(id)
    }

    /// How many bytes `read` would return now (contiguous data not yet read).
    pub fn readable_bytes(&self, id: StreamId) -> usize {
        self.streams.readable_bytes(id)
    }

    /// Aborts a stream in both directions; the peer gets [`Event::StreamReset`].
    pub fn reset(&mut self, id: StreamId, code: u64) -> Result<(), StreamError> {
        self.streams.reset(id, code)
    }

    /// Queues a control message for the peer: reliable, delivered in order, at most
    /// [`MAX_CONTROL_LEN`] bytes, at most [`MAX_CONTROL_MESSAGES`] outstanding.
    pub fn send_control(&mut self, message: &[u8]) -> Result<(), ControlError> {
        let connected = self.can_carry_streams();
        self.control.send(message, connected)
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
        let reason = &reason[..reason.len().min(MAX_REASON_LEN)];
        self.close_frame = Some((code, reason.to_vec()));
        self.close_resend = true;
        self.state = State::Closing {
            until: now + self.rtt().pto_base() * 3,
        };
        self.events
            .push_back(Event::ConnectionLost(ConnectionError::LocallyClosed));
    }

    /// Closes the connection with `code` and says why in the event it reports.
    fn close_with(&mut self, now: Instant, code: u64, reason: &[u8], error: ConnectionError) {
        self.close(now, code, reason);
        if let Some(Event::ConnectionLost(e)) = self.events.back_mut() {
            *e = error;
        }
    }

    fn protocol_violation(&mut self, now: Instant, error: TransportError) {
        tracing::debug!(%error, "closing on protocol violation");
        let reason = error.reason.clone();
        let code = error.code;
        self.close_with(
            now,
            code,
            reason.as_bytes(),
            ConnectionError::ProtocolViolation(error),
        );
    }

    /// Ends this connection because the endpoint accepted a newer one from the same peer
    /// ([`crate::DatagramEvent::NewConnection`] names it in `replaces`). An established
    /// one is closed with [`CLOSE_REPLACED`]: a peer that restarted does not know it any
    /// more and drops the close, but one that still holds it (it connected again without
    /// giving this one up) learns at once that it is over, instead of finding it silent.
    /// One still in its handshake just ends: the peer's newer attempt supersedes it.
    pub fn replaced(&mut self, now: Instant) {
        match self.state {
            State::Closing { .. } | State::Draining { .. } | State::Drained => {}
            State::Handshake(_) | State::AwaitingConfirmation { .. } => {
                self.state = State::Drained;
                self.events
                    .push_back(Event::ConnectionLost(ConnectionError::Replaced));
            }
            State::Established => self.close_with(
                now,
                CLOSE_REPLACED,
                b"replaced by a newer connection",
                ConnectionError::Replaced,
            ),
        }
    }

    // ---- Timers -----------------------------------------------------------------------------

    /// Every timer's deadline, from the state that sets it.
    fn timers(&self) -> TimerTable {
        let mut timers = TimerTable::default();
        match &self.state {
            State::Drained => return timers,
            State::Closing { until } | State::Draining { until } => {
                timers.set(Timer::Close, Some(*until));
                return timers;
            }
            State::Handshake(init) => {
                timers.set(Timer::HandshakeRetry, Some(init.deadline()));
                return timers;
            }
            State::AwaitingConfirmation { .. } | State::Established => {}
        }
        timers.set(Timer::Idle, Some(self.last_heard + self.idle_timeout()));
        timers.set(
            Timer::LossDetection,
            self.recovery.loss_detection_deadline(),
        );
        timers.set(Timer::Ack, self.acks.deadline());
        if self.is_established() {
            // Once a PING is pending the keepalive has done its part; the PING leaves when
            // the pacer and the window let it.
            if !self.ping_pending {
                timers.set(
                    Timer::KeepAlive,
                    Some(self.last_sent + self.config.keepalive),
                );
            }
            if self.wants_to_send_data() && self.recovery.window_room() > 0 {
                let pacing = match (self.pacer.next(), self.held_until) {
                    (Some(pacer), Some(held)) => Some(pacer.max(held)),
                    (pacer, held) => held.or(pacer),
                };
                timers.set(Timer::Pacing, pacing);
            }
            let fec = self.recovery.fec.as_ref();
            timers.set(Timer::FecFlush, fec.and_then(|f| f.deadline()));
            timers.set(
                Timer::BufferSweep,
                self.streams
                    .holds_buffers()
                    .then_some(self.next_buffer_sweep),
            );
        }
        timers
    }

    /// When `handle_timeout` must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers().next()
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        let timers = self.timers();
        for timer in timers.expired(now) {
            match timer {
                Timer::Close => {
                    self.state = State::Drained;
                    return;
                }
                Timer::HandshakeRetry => return self.on_handshake_timeout(now),
                Timer::Idle => {
                    self.state = State::Drained;
                    self.events
                        .push_back(Event::ConnectionLost(ConnectionError::TimedOut));
                    return;
                }
                Timer::LossDetection => {
                    let mut frames = FrameOwners {
                        streams: &mut self.streams,
                        control: &mut self.control,
                    };
                    match self.recovery.on_timeout(now, self.last_heard, &mut frames) {
                        Timeout::Detected => {}
                        Timeout::Probe => self.ping_pending = true,
                    }
                }
                Timer::KeepAlive => self.ping_pending = true,
                Timer::FecFlush => {
                    if let Some(fec) = &mut self.recovery.fec {
                        fec.on_timeout(now);
                    }
                }
                Timer::BufferSweep => {
                    self.streams.release_idle_buffers();
                    self.next_buffer_sweep = now + BUFFER_SWEEP;
                }
                // Served by `poll_transmit`.
                Timer::Ack | Timer::Pacing => {}
            }
        }
    }

    fn on_handshake_timeout(&mut self, now: Instant) {
        let State::Handshake(init) = &mut self.state else {
            return;
        };
        if !init.on_timeout(now, self.config.handshake_attempts) {
            self.state = State::Drained;
            self.events
                .push_back(Event::ConnectionLost(ConnectionError::HandshakeTimedOut));
        }
    }
}

/// The owners of what sent packets carried: recovery hands them their frames back when a
/// packet is acknowledged or lost.
struct FrameOwners<'a> {
    streams: &'a mut Streams,
    control: &'a mut ControlChannel,
}

impl FrameOutcome for FrameOwners<'_> {
    fn on_acked(&mut self, frame: SentFrame) {
        match frame {
            SentFrame::Stream(f) => self.streams.on_acked(f),
            SentFrame::Control(seq) => self.control.on_acked(seq),
        }
    }

    fn on_lost(&mut self, frame: SentFrame) {
        match frame {
            SentFrame::Stream(f) => self.streams.on_lost(f),
            SentFrame::Control(seq) => self.control.on_lost(seq),
        }
    }
}
