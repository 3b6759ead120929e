//! Loss recovery: the packets in flight, what their acknowledgements and losses mean, and the
//! congestion controller and FEC sender that act on them.
//!
//! Reliability follows RFC 9002: loss by packet threshold (3) and time threshold (9/8 RTT),
//! probe timeouts with exponential backoff. What a lost packet carried is handed back to its
//! owner ([`FrameOutcome`]) to be queued again — never the packet itself, whose number is
//! never reused.
//!
//! Path MTU discovery's probes are tracked here with the other packets (their loss is not
//! congestion), and so are black holes: full-size packets that stop being acknowledged while
//! smaller ones get through. Either falls back to the base datagram size ([`PathMtu`]).

use super::error::TransportError;
use super::fec::{FecSender, Repair};
use super::mtu::{BASE_DATAGRAM, PathMtu};
use crate::congestion::{
    AckEvent, CongestionControl, Controller, ControllerState, DeliveryRate, LossEvent, LossVerdict,
    LostPacket, PacketSnapshot, PathHint, PathParams,
};
use crate::rtt::{GRANULARITY, INITIAL_RTT, RttEstimator};
use crate::streams::StreamFrameSent;
use crate::wire::Ack;
use crate::wire::frame::{ACK, RECOVERED};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// RFC 9002 kPacketThreshold.
const PACKET_THRESHOLD: u64 = 3;
/// RFC 9002 kTimeThreshold, as a fraction 9/8.
const TIME_THRESHOLD_NUM: u32 = 9;
const TIME_THRESHOLD_DEN: u32 = 8;
/// Consecutive probe timeouts taken as persistent congestion (RFC 9002 §7.6 uses a duration
/// of three PTOs; three backed-off PTOs in a row is a longer silence than that).
const PERSISTENT_CONGESTION_PTOS: u32 = 3;
/// Packets larger than [`BASE_DATAGRAM`] are watched for a black hole, which is declared when
/// at least this many were sent since the last one was acknowledged (random loss, even
/// heavy, does not lose them all) and either a smaller packet sent after the first of them
/// was acknowledged, or, failing that, none was for [`BLACK_HOLE_AFTER`] while the peer was
/// heard from.
const BLACK_HOLE_PACKETS: u32 = 8;
const BLACK_HOLE_AFTER: Duration = Duration::from_secs(3);
/// The least the streams may queue for sending, whatever the window: enough for a fresh
/// connection's first rounds, and for a path whose window a loss just cut.
pub(super) const MIN_SEND_BUDGET: u64 = 256 * 1024;

/// What a sent packet carried that must be acted on when it is acknowledged or lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SentFrame {
    Stream(StreamFrameSent),
    Control(u64),
}

/// What one packet carried to track: held in the packet's record, so that sending a packet
/// allocates nothing unless it carries more than two such frames (a packet of one stream
/// carries one). A pool of reused lists had run dry whenever more packets were in flight
/// than it kept: a `malloc` per packet, 1.1 % of the sending gateway at line rate.
pub(super) type FrameList = SmallVec<[SentFrame; 2]>;

/// Where the frames of acknowledged and lost packets go (the streams and the control
/// channel, which recovery does not own).
pub(super) trait FrameOutcome {
    fn on_acked(&mut self, frame: SentFrame);
    fn on_lost(&mut self, frame: SentFrame);
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
    /// A path MTU probe: padding only, and its loss is not congestion.
    mtu_probe: bool,
    snapshot: PacketSnapshot,
    frames: FrameList,
}

/// Large packets sent since the last one was acknowledged.
#[derive(Debug, Clone, Copy)]
struct LargeUnacked {
    since: Instant,
    sent: u32,
}

/// What a loss-detection timeout found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timeout {
    /// Packets were declared lost by time.
    Detected,
    /// A probe timeout: up to two probes should be sent.
    Probe,
}

/// Counters of recovery, for [`ConnectionStats`](super::ConnectionStats).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RecoveryStats {
    pub(super) packets_lost: u64,
    pub(super) bytes_lost: u64,
    pub(super) pto_count: u64,
}

#[derive(Debug)]
pub(super) struct Recovery {
    next_pn: u64,
    /// Sent packets from `sent_base` on; `None` once acknowledged or lost.
    sent: VecDeque<Option<SentPacket>>,
    sent_base: u64,
    in_flight: u64,
    eliciting_in_flight: u64,
    largest_acked: Option<u64>,
    loss_time: Option<Instant>,
    pto_count: u32,
    last_eliciting_sent: Option<Instant>,
    /// Probe packets still to send after a probe timeout.
    probes: u32,
    large_unacked: Option<LargeUnacked>,
    /// The path MTU search and the size packets are built to.
    pub(super) mtu: PathMtu,
    peer_max_ack_delay: Duration,
    rtt: RttEstimator,
    delivery: DeliveryRate,
    controller: Option<Box<dyn Controller>>,
    /// The FEC sender, once the datagram size is agreed.
    pub(super) fec: Option<Box<FecSender>>,
    stats: RecoveryStats,
    lost_scratch: Vec<LostPacket>,
    /// Acknowledged packets the peer rebuilt from parity: losses for the controller.
    recovered_scratch: Vec<LostPacket>,
}

impl Recovery {
    /// Until the peer's parameters arrive, its ACK delay is taken to be `max_ack_delay`.
    pub(super) fn new(now: Instant, max_ack_delay: Duration, mtu: PathMtu) -> Self {
        Self {
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
            mtu,
            peer_max_ack_delay: max_ack_delay,
            rtt: RttEstimator::new(INITIAL_RTT),
            delivery: DeliveryRate::new(now),
            controller: None,
            fec: None,
            stats: RecoveryStats::default(),
            lost_scratch: Vec::new(),
            recovered_scratch: Vec::new(),
        }
    }

    /// The peer's parameters arrived: its ACK delay, and the FEC sender for the agreed
    /// datagram size.
    pub(super) fn on_peer_params(&mut self, peer_max_ack_delay: Duration, fec: FecSender) {
        self.peer_max_ack_delay = peer_max_ack_delay;
        self.fec = Some(Box::new(fec));
    }

    /// The connection is established: the controller starts from the handshake's RTT.
    pub(super) fn start(
        &mut self,
        now: Instant,
        congestion: &CongestionControl,
        params: PathParams,
    ) {
        let params = PathParams {
            initial_rtt: self.rtt.smoothed(),
            peer_ack_delay: self.peer_max_ack_delay,
            ..params
        };
        self.controller = Some(congestion.build(now, &params));
    }

    pub(super) fn rtt(&self) -> &RttEstimator {
        &self.rtt
    }

    /// A round trip measured outside ACKs (the handshake).
    pub(super) fn on_rtt_sample(&mut self, rtt: Duration) {
        self.rtt.update(rtt, Duration::ZERO);
    }

    pub(super) fn peer_max_ack_delay(&self) -> Duration {
        self.peer_max_ack_delay
    }

    pub(super) fn stats(&self) -> RecoveryStats {
        self.stats
    }

    pub(super) fn controller_state(&self) -> Option<ControllerState> {
        self.controller.as_ref().map(|c| c.state())
    }

    pub(super) fn path_hint(&self) -> Option<PathHint> {
        self.controller.as_ref()?.path_hint()
    }

    /// Bytes sent and not yet acknowledged or declared lost.
    pub(super) fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// What the congestion window lets be sent now.
    pub(super) fn window_room(&self) -> u64 {
        let window = self.controller.as_ref().map_or(0, |c| c.window());
        window.saturating_sub(self.in_flight)
    }

    /// The most bytes all streams together may queue for sending, written and never sent:
    /// the congestion window (twice the path's bandwidth-delay product once the controller
    /// has measured it), never less than [`MIN_SEND_BUDGET`]. The application is read only as
    /// fast as the path drains it, instead of filling the configured buffers with seconds of
    /// data the far end has not seen; what is in flight is the window's to bound.
    pub(super) fn send_budget(&self) -> u64 {
        let window = self.controller.as_ref().map_or(0, |c| c.window());
        window.max(MIN_SEND_BUDGET)
    }

    /// The controller's pacing rate, under the operator's cap.
    pub(super) fn pacing_rate(&self, max_rate: Option<u64>) -> u64 {
        let rate = self.controller.as_ref().map_or(0, |c| c.pacing_rate());
        max_rate.map_or(rate, |cap| rate.min(cap))
    }

    /// The number the next packet gets.
    pub(super) fn next_pn(&self) -> u64 {
        self.next_pn
    }

    pub(super) fn probes(&self) -> u32 {
        self.probes
    }

    /// Whether full-size packets are going unacknowledged in numbers, for a whole probe
    /// timeout (the peer's ACK delay included): packets are then built to the base size, so
    /// that their acknowledgement tells a black hole from a path that is down (and their
    /// data gets through it).
    pub(super) fn suspects_black_hole(&self, now: Instant) -> bool {
        let pto = self.rtt.pto_base() + self.peer_max_ack_delay;
        self.large_unacked
            .is_some_and(|l| l.sent >= BLACK_HOLE_PACKETS && now >= l.since + pto)
    }

    pub(super) fn on_probes_sent(&mut self, count: u32) {
        self.probes = self.probes.saturating_sub(count);
    }

    /// Out of data with room to send: rate samples now measure the application.
    pub(super) fn on_app_limited(&mut self) {
        self.delivery.on_app_limited(self.in_flight);
    }

    /// Takes the next packet number for a packet that carries nothing to track (a CLOSE).
    pub(super) fn take_pn(&mut self) -> u64 {
        self.sent.push_back(None);
        self.next_pn += 1;
        self.next_pn - 1
    }

    /// Records packet `next_pn` as sent: `size` bytes carrying `frames`.
    pub(super) fn on_packet_sent(
        &mut self,
        now: Instant,
        size: usize,
        eliciting: bool,
        frames: FrameList,
    ) {
        self.record_sent(now, size, eliciting, false, frames);
    }

    /// Records packet `next_pn` as sent: a path MTU probe of `size` bytes. It elicits an
    /// ACK, but counts neither in flight nor toward a probe timeout (see `mtu.rs`).
    pub(super) fn on_mtu_probe_sent(&mut self, now: Instant, size: usize) {
        self.mtu.on_probe_sent(size as u16);
        self.record_sent(now, size, false, true, FrameList::new());
    }

    fn record_sent(
        &mut self,
        now: Instant,
        size: usize,
        eliciting: bool,
        mtu_probe: bool,
        frames: FrameList,
    ) {
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
            self.in_flight += size as u64;
            self.eliciting_in_flight += 1;
            self.last_eliciting_sent = Some(now);
            if let Some(c) = &mut self.controller {
                c.on_sent(now, size as u64, self.in_flight);
            }
        }
        debug_assert_eq!(self.next_pn, self.sent_base + self.sent.len() as u64);
        self.sent.push_back(Some(SentPacket {
            time: now,
            size: size as u16,
            parity_bytes: 0,
            recovered: false,
            eliciting,
            mtu_probe,
            snapshot,
            frames,
        }));
        self.next_pn += 1;
    }

    /// Packets are built to `size` bytes from now on (path MTU discovery): FEC closes its
    /// block and codes the next ones for it; the controller counts its minimum window in it.
    pub(super) fn on_datagram_size(&mut self, size: usize) {
        if let Some(fec) = &mut self.fec {
            fec.set_max_datagram(size);
        }
        if let Some(c) = &mut self.controller {
            c.on_max_datagram(size as u64);
        }
    }

    /// A parity packet of `len` bytes left for the block ending with packet `owner`: its
    /// bytes count in flight with that packet.
    pub(super) fn on_parity_sent(&mut self, owner: Option<u64>, len: usize) {
        let index = owner.and_then(|pn| pn.checked_sub(self.sent_base));
        if let Some(Some(packet)) = index.and_then(|i| self.sent.get_mut(i as usize)) {
            packet.parity_bytes += len as u32;
            self.in_flight += len as u64;
        }
    }

    /// A burst of parity (`bytes`) left: the controller counts it as sent.
    pub(super) fn on_parity_burst(&mut self, now: Instant, bytes: u64) {
        if let Some(c) = &mut self.controller {
            c.on_sent(now, bytes, self.in_flight);
        }
    }

    // ---- Acknowledgements -----------------------------------------------------------------

    /// The peer rebuilt these packets from parity: mark them, so that their acknowledgement
    /// (in the ACK frame that follows) counts them as losses too.
    pub(super) fn on_recovered_frame(&mut self, ranges: &Ack) -> Result<(), TransportError> {
        if ranges.largest() >= self.next_pn {
            let reason = format!("RECOVERED of unsent packet {}", ranges.largest());
            return Err(TransportError::violation(Some(RECOVERED), reason));
        }
        for range in ranges.ranges() {
            let lo = (*range.start()).max(self.sent_base);
            for pn in lo..=*range.end() {
                if let Some(Some(packet)) = self.sent.get_mut((pn - self.sent_base) as usize) {
                    packet.recovered = true;
                }
            }
        }
        Ok(())
    }

    /// An ACK frame: frees what it acknowledges, samples the RTT and the delivery rate,
    /// detects losses, and tells the controller of both, in that order.
    pub(super) fn on_ack_frame(
        &mut self,
        now: Instant,
        ack: &Ack,
        frames: &mut impl FrameOutcome,
    ) -> Result<(), TransportError> {
        let largest = ack.largest();
        if largest >= self.next_pn {
            let reason = format!("ACK of unsent packet {largest}");
            return Err(TransportError::violation(Some(ACK), reason));
        }
        let acked = self.take_acked(now, ack, frames);
        self.trim_sent();
        let unanswered = self
            .large_unacked
            .is_some_and(|l| l.sent >= BLACK_HOLE_PACKETS);
        if acked.small_after_large && unanswered {
            self.on_black_hole(now);
        }
        if acked.packets == 0 {
            return Ok(());
        }
        if self.largest_acked.is_none_or(|l| largest > l) {
            self.largest_acked = Some(largest);
        }
        let delay = Duration::from_micros(ack.delay_us).min(self.peer_max_ack_delay);
        if let Some(sample) = acked.rtt_sample {
            self.rtt.update(sample, delay);
        }
        // The controller reads queueing from RTT samples, and the time the peer held this ACK
        // is not queueing: with a few packets in flight a receiver holds ACKs up to its
        // max_ack_delay, as much as a quarter of the RTT, which once read as a full queue.
        // (Subtracted as RttEstimator does: never below the minimum.)
        let rtt_sample = acked
            .rtt_sample
            .map(|sample| sample.saturating_sub(delay).max(self.rtt.min().min(sample)));
        self.pto_count = 0;
        self.detect_lost(now, frames);
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
            .take_sample(self.rtt.min(), now.checked_sub(delay).unwrap_or(now))
            .unwrap_or((self.delivery.delivered(), None));
        if let Some(controller) = &mut self.controller {
            let event = AckEvent {
                acked_bytes: acked.bytes,
                acked_packets: acked.packets,
                in_flight: self.in_flight,
                rtt: &self.rtt,
                rtt_sample,
                rate,
                prior_delivered,
                delivered: self.delivery.delivered(),
            };
            controller.on_ack(now, &event);
        }
        self.report_lost(now);
        Ok(())
    }

    /// Takes the packets `ack` acknowledges out of the sent list and accounts for them.
    fn take_acked(&mut self, now: Instant, ack: &Ack, frames: &mut impl FrameOutcome) -> Acked {
        let largest = ack.largest();
        let mut acked = Acked::default();
        for range in ack.ranges() {
            let lo = (*range.start()).max(self.sent_base);
            for pn in lo..=*range.end() {
                let index = (pn - self.sent_base) as usize;
                let Some(packet) = self.sent.get_mut(index).and_then(Option::take) else {
                    continue;
                };
                if pn == largest && packet.eliciting {
                    acked.rtt_sample = Some(now.saturating_duration_since(packet.time));
                }
                acked.packets += 1;
                if packet.mtu_probe {
                    self.mtu.on_probe_acked(now, packet.size);
                } else if packet.size > BASE_DATAGRAM {
                    self.large_unacked = None;
                } else if packet.eliciting {
                    acked.small_after_large |=
                        self.large_unacked.is_some_and(|l| packet.time > l.since);
                }
                let bytes = u64::from(packet.size) + u64::from(packet.parity_bytes);
                acked.bytes += bytes;
                self.in_flight -= u64::from(packet.parity_bytes);
                if packet.eliciting {
                    self.in_flight -= u64::from(packet.size);
                    self.eliciting_in_flight -= 1;
                    self.delivery
                        .on_acked(now, bytes, packet.time, &packet.snapshot);
                }
                if let Some(fec) = self.fec.as_mut().filter(|_| !packet.mtu_probe) {
                    fec.on_outcome(pn, packet.recovered);
                    if packet.recovered {
                        fec.on_peer_recovered();
                        self.recovered_scratch.push(LostPacket {
                            number: pn,
                            bytes: u64::from(packet.size),
                            sent: packet.time,
                            repaired: true,
                        });
                    }
                }
                for &frame in &packet.frames {
                    frames.on_acked(frame);
                }
            }
        }
        acked
    }

    // ---- Losses ---------------------------------------------------------------------------

    /// When loss detection next needs to run: the time threshold of the oldest packet not
    /// yet lost by count, or else the probe timeout.
    pub(super) fn loss_detection_deadline(&self) -> Option<Instant> {
        if self.loss_time.is_some() {
            return self.loss_time;
        }
        if self.eliciting_in_flight == 0 {
            return None;
        }
        let last = self.last_eliciting_sent?;
        let pto = self.rtt.pto_base() + self.peer_max_ack_delay;
        Some(last + pto * (1 << self.pto_count.min(10)))
    }

    /// The loss-detection timer fired. `last_heard` is when the peer was last heard from.
    pub(super) fn on_timeout(
        &mut self,
        now: Instant,
        last_heard: Instant,
        frames: &mut impl FrameOutcome,
    ) -> Timeout {
        let outcome = if self.loss_time.is_some() {
            self.detect_lost(now, frames);
            self.report_lost(now);
            Timeout::Detected
        } else {
            // Probe timeout: the tail went unacknowledged. Send up to two probes, which
            // elicit an ACK that shows what was lost.
            self.pto_count += 1;
            self.stats.pto_count += 1;
            self.probes = 2;
            if self.pto_count == PERSISTENT_CONGESTION_PTOS {
                if let Some(c) = &mut self.controller {
                    c.on_persistent_congestion(now);
                }
            }
            Timeout::Probe
        };
        if self.is_black_hole(now, last_heard) {
            self.on_black_hole(now);
        }
        outcome
    }

    /// Full-size packets stopped getting through: every packet is built to the base size
    /// until the search finds what the path carries now. Those in flight that no longer fit
    /// are lost to the path, not to congestion (see [`Self::on_packet_lost`]).
    fn on_black_hole(&mut self, now: Instant) {
        tracing::info!(
            size = self.mtu.current(),
            "path MTU: full-size packets stopped getting through; back to 1200 bytes"
        );
        self.large_unacked = None;
        self.mtu.on_black_hole(now);
    }

    /// The peer is heard again after a silence (the link was down): full-size packets
    /// unacknowledged so far say nothing about the path's MTU, so the black-hole window
    /// starts again now.
    pub(super) fn on_peer_back(&mut self, now: Instant) {
        if let Some(large) = &mut self.large_unacked {
            large.since = now;
            large.sent = 0;
        }
    }

    /// Whether full-size packets have stopped getting through: none acknowledged for
    /// [`BLACK_HOLE_AFTER`] though [`BLACK_HOLE_PACKETS`] were sent, while the peer was heard
    /// from (so the path itself is up). Checked when the loss timer fires, which keeps
    /// happening while they vanish.
    fn is_black_hole(&self, now: Instant, last_heard: Instant) -> bool {
        self.large_unacked.is_some_and(|large| {
            now >= large.since + BLACK_HOLE_AFTER
                && large.sent >= BLACK_HOLE_PACKETS
                && last_heard > large.since
        })
    }

    /// Declares lost every unacknowledged packet far enough below the largest acknowledged
    /// (RFC 9002 §6.1), and sets the timer for the ones not yet far enough.
    fn detect_lost(&mut self, now: Instant, frames: &mut impl FrameOutcome) {
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
        for pn in self.sent_base..end {
            let index = (pn - self.sent_base) as usize;
            let Some(packet) = &self.sent[index] else {
                continue;
            };
            // A protected packet counts from its block's parity: the receiver may still
            // rebuild it.
            let repair = self.fec.as_ref().map_or(Repair::None, |f| f.repair(pn));
            let (from_pn, from_time) = match repair {
                Repair::None => (pn, packet.time),
                Repair::Pending => continue,
                Repair::After { pn: after, time } => {
                    (after.saturating_sub(1).max(pn), time.max(packet.time))
                }
            };
            let by_count = largest >= from_pn && largest - from_pn >= PACKET_THRESHOLD;
            let by_time = lost_before.is_some_and(|t| from_time <= t);
            if by_count || by_time {
                if let Some(packet) = self.sent[index].take() {
                    self.on_packet_lost(now, pn, packet, &mut lost, frames);
                }
            } else {
                let at = from_time + loss_delay;
                self.loss_time = Some(self.loss_time.map_or(at, |t| t.min(at)));
            }
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
            let event = LossEvent {
                lost: &self.lost_scratch,
                in_flight: self.in_flight,
                rtt: &self.rtt,
            };
            let verdict = controller.on_loss(now, &event);
            // A queue overflowing is not the path's own loss: FEC must not buy parity
            // against it. (Clustered losses may be the line's own bursts.)
            if verdict == LossVerdict::Overflow {
                if let Some(fec) = &mut self.fec {
                    fec.on_overflow(self.next_pn);
                }
            }
        }
        self.lost_scratch.clear();
    }

    /// A packet is lost. A path MTU probe, or a packet larger than the path is now known to
    /// carry, tells nothing of congestion or of the line's loss rate: neither the controller
    /// nor FEC's loss meter hears of it.
    fn on_packet_lost(
        &mut self,
        now: Instant,
        number: u64,
        packet: SentPacket,
        lost: &mut Vec<LostPacket>,
        frames: &mut impl FrameOutcome,
    ) {
        self.in_flight -= u64::from(packet.parity_bytes);
        if packet.eliciting {
            self.in_flight -= u64::from(packet.size);
            self.eliciting_in_flight -= 1;
        }
        if packet.mtu_probe {
            self.mtu.on_probe_lost(now, packet.size);
            return;
        }
        self.stats.packets_lost += 1;
        self.stats.bytes_lost += u64::from(packet.size);
        let too_big = packet.size > self.mtu.current();
        if let Some(fec) = self.fec.as_mut().filter(|_| !too_big) {
            fec.on_outcome(number, true);
        }
        if packet.eliciting && !too_big {
            lost.push(LostPacket {
                number,
                bytes: u64::from(packet.size),
                sent: packet.time,
                repaired: false,
            });
        }
        for &frame in &packet.frames {
            frames.on_lost(frame);
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
}

/// What one ACK frame acknowledged.
#[derive(Debug, Default)]
struct Acked {
    packets: u64,
    bytes: u64,
    /// The round trip of the largest acknowledged, if it was newly acknowledged and elicited
    /// the ACK.
    rtt_sample: Option<Duration>,
    /// An ack-eliciting packet of at most the base size, sent after the oldest full-size
    /// packet still unacknowledged.
    small_after_large: bool,
}

#[cfg(test)]
mod tests;
