//! The receiver's acknowledgement state: which packets arrived and when an ACK is due.
//!
//! Acknowledgements are economical (PROTOCOL.md §5): the receiver acknowledges every
//! `ack_every` ack-eliciting packets or after an ACK delay (a quarter of the RTT, within
//! [5 ms, `max_ack_delay`]), and early — at most once per NAK interval (an eighth of the RTT)
//! — when a gap appears. The first ack-eliciting packet after a quiet spell (none for an ACK
//! delay) is acknowledged at once: with the ACK that follows it, the sender learns when the
//! start and the end of a short flight arrived, and so the rate the path carried it at. Each
//! ACK frame carries up to [`MAX_ACK_RANGES`] ranges, so a lost ACK costs nothing: the next
//! one repeats it.

use crate::range_set::RangeSet;
use crate::rtt::{GRANULARITY, RttEstimator};
use crate::wire::frame::{Ack, MAX_ACK_RANGES};
use std::time::{Duration, Instant};

/// Received-packet ranges remembered for ACK frames.
pub(super) const ACK_RANGES_KEPT: usize = MAX_ACK_RANGES;

#[derive(Debug)]
pub(super) struct AckState {
    ack_every: u32,
    max_ack_delay: Duration,
    received: RangeSet,
    largest: Option<(u64, Instant)>,
    /// Ack-eliciting packets received since the last ACK sent.
    unacked_eliciting: u32,
    deadline: Option<Instant>,
    last_sent: Option<Instant>,
    /// When the last ack-eliciting packet arrived.
    last_eliciting: Option<Instant>,
}

impl AckState {
    pub(super) fn new(ack_every: u32, max_ack_delay: Duration) -> Self {
        Self {
            ack_every,
            max_ack_delay,
            received: RangeSet::new(),
            largest: None,
            unacked_eliciting: 0,
            deadline: None,
            last_sent: None,
            last_eliciting: None,
        }
    }

    /// Whether any packet was received (there is something to acknowledge).
    pub(super) fn has_received(&self) -> bool {
        self.largest.is_some()
    }

    /// Whether `number` is above every packet received so far.
    pub(super) fn is_newest(&self, number: u64) -> bool {
        self.largest.is_none_or(|(n, _)| number > n)
    }

    /// Records a received packet number and decides when to acknowledge it.
    pub(super) fn on_packet(
        &mut self,
        now: Instant,
        number: u64,
        eliciting: bool,
        rtt: &RttEstimator,
    ) {
        let gap = self
            .largest
            .is_some_and(|(largest, _)| number > largest + 1 || number < largest);
        self.received.insert(number..number + 1);
        self.received.keep_highest(ACK_RANGES_KEPT);
        if self.is_newest(number) {
            self.largest = Some((number, now));
        }
        if !eliciting {
            return;
        }
        let delay = self.delay(rtt);
        let quiet = self.unacked_eliciting == 0
            && self
                .last_eliciting
                .is_none_or(|t| now.saturating_duration_since(t) >= delay);
        self.last_eliciting = Some(now);
        self.unacked_eliciting += 1;
        let mut deadline = now + delay;
        if self.unacked_eliciting >= self.ack_every || quiet {
            deadline = now;
        }
        if gap {
            // A hole (or a late packet filling one): tell the sender soon, but not more often
            // than once per NAK interval.
            let nak_at = self
                .last_sent
                .map_or(now, |t| (t + nak_interval(rtt)).max(now));
            deadline = deadline.min(nak_at);
        }
        self.deadline = Some(self.deadline.map_or(deadline, |d| d.min(deadline)));
    }

    /// Asks for an ACK now, if anything waits to be acknowledged (a rebuilt ACK-only packet
    /// asks for nothing: a deadline without an ACK due would never be cleared).
    pub(super) fn ack_now(&mut self, now: Instant) {
        if self.unacked_eliciting > 0 {
            self.deadline = Some(now);
        }
    }

    /// Whether an ACK must be sent now.
    pub(super) fn is_due(&self, now: Instant) -> bool {
        self.unacked_eliciting > 0 && self.deadline.is_some_and(|d| d <= now)
    }

    /// Whether some ack-eliciting packet is not acknowledged yet (an ACK may then ride on
    /// data before it is due).
    pub(super) fn is_pending(&self) -> bool {
        self.unacked_eliciting > 0
    }

    /// When the ACK timer fires.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The ACK frame to send now, as much of it as fits in `room` bytes.
    pub(super) fn frame(&self, now: Instant, room: usize) -> Option<Ack> {
        let (_, received_at) = self.largest?;
        let delay = now.saturating_duration_since(received_at).as_micros() as u64;
        Ack::acknowledging(self.received.iter(), delay, room)
    }

    /// An ACK left in a packet.
    pub(super) fn on_sent(&mut self, now: Instant) {
        self.unacked_eliciting = 0;
        self.deadline = None;
        self.last_sent = Some(now);
    }

    /// How long an ACK may wait: a quarter of the RTT, within [5 ms, max_ack_delay].
    fn delay(&self, rtt: &RttEstimator) -> Duration {
        (rtt.smoothed() / 4).clamp(
            Duration::from_millis(5).min(self.max_ack_delay),
            self.max_ack_delay,
        )
    }
}

/// The least time between two ACKs sent early for gaps: an eighth of the RTT, at least
/// 1 ms. At most eight NAK-triggered ACKs per RTT, however many packets are lost.
fn nak_interval(rtt: &RttEstimator) -> Duration {
    (rtt.smoothed() / 8).max(GRANULARITY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Frame, Frames, Writer};

    const MS: Duration = Duration::from_millis(1);

    /// An RTT estimator that has seen 100 ms.
    fn rtt_100ms() -> RttEstimator {
        let mut rtt = RttEstimator::new(100 * MS);
        rtt.update(100 * MS, Duration::ZERO);
        rtt
    }

    fn state() -> AckState {
        AckState::new(16, 25 * MS)
    }

    /// The ranges of the ACK frame written at `now`, highest first, and its delay.
    fn ack_written(acks: &AckState, now: Instant) -> (Vec<(u64, u64)>, u64) {
        let ack = acks.frame(now, 200).expect("an ACK");
        let mut buf = [0u8; 200];
        let mut w = Writer::new(&mut buf);
        assert!(Frame::Ack(ack).encode_if_fits(&mut w));
        let n = w.len();
        let Some(Ok(Frame::Ack(parsed))) = Frames::new(&buf[..n]).next() else {
            panic!("not an ACK");
        };
        let ranges = parsed.ranges().map(|r| (*r.start(), *r.end())).collect();
        (ranges, parsed.delay_us)
    }

    #[test]
    fn the_first_packet_after_a_quiet_spell_is_acknowledged_at_once() {
        let (t0, rtt) = (crate::test_epoch(), rtt_100ms());
        let mut acks = state();
        acks.on_packet(t0, 0, true, &rtt);
        assert!(acks.is_due(t0), "the very first packet");
        acks.on_sent(t0);
        // The rest of the flight waits as usual.
        acks.on_packet(t0 + MS, 1, true, &rtt);
        assert_eq!(acks.deadline(), Some(t0 + 26 * MS));
        acks.on_sent(t0 + 26 * MS);
        // 10 ms after the last packet is not quiet (the ACK delay is 25 ms)...
        acks.on_packet(t0 + 11 * MS, 2, true, &rtt);
        assert_eq!(acks.deadline(), Some(t0 + 36 * MS));
        acks.on_sent(t0 + 36 * MS);
        // ...but 25 ms without one is; a packet that asks for no ACK neither counts nor
        // starts one.
        acks.on_packet(t0 + 30 * MS, 3, false, &rtt);
        assert!(!acks.is_pending());
        acks.on_packet(t0 + 36 * MS, 4, true, &rtt);
        assert!(acks.is_due(t0 + 36 * MS));
    }

    #[test]
    fn in_order_packets_wait_for_the_ack_delay_or_the_count() {
        let (t0, rtt) = (crate::test_epoch(), rtt_100ms());
        let mut acks = state();
        // Packets have been arriving: the flight is under way.
        acks.on_packet(t0 - MS, 0, true, &rtt);
        acks.on_sent(t0 - MS);
        acks.on_packet(t0, 0, true, &rtt);
        // A quarter of 100 ms is more than max_ack_delay: 25 ms.
        assert_eq!(acks.deadline(), Some(t0 + 25 * MS));
        assert!(!acks.is_due(t0 + 24 * MS) && acks.is_due(t0 + 25 * MS));
        for pn in 1..15 {
            acks.on_packet(t0 + MS, pn, true, &rtt);
        }
        assert_eq!(acks.deadline(), Some(t0 + 25 * MS));
        acks.on_packet(t0 + 2 * MS, 15, true, &rtt);
        assert_eq!(
            acks.deadline(),
            Some(t0 + 2 * MS),
            "the 16th packet asks at once"
        );
        assert_eq!(ack_written(&acks, t0 + 3 * MS), (vec![(0, 15)], 1000));
        acks.on_sent(t0 + 3 * MS);
        assert!(!acks.is_pending() && acks.deadline().is_none());
    }

    #[test]
    fn a_gap_asks_early_but_at_most_once_per_nak_interval() {
        let (t0, rtt) = (crate::test_epoch(), rtt_100ms());
        let mut acks = state();
        acks.on_packet(t0, 0, true, &rtt);
        acks.on_packet(t0, 2, true, &rtt);
        assert!(acks.is_due(t0), "a hole is reported at once");
        assert_eq!(ack_written(&acks, t0).0, vec![(2, 2), (0, 0)]);
        acks.on_sent(t0);
        // Another hole 1 ms later: the next early ACK waits for the NAK interval (12.5 ms).
        acks.on_packet(t0 + MS, 5, true, &rtt);
        assert_eq!(acks.deadline(), Some(t0 + Duration::from_micros(12_500)));
    }

    #[test]
    fn packets_that_elicit_nothing_are_recorded_but_ask_for_nothing() {
        let (t0, rtt) = (crate::test_epoch(), rtt_100ms());
        let mut acks = state();
        acks.on_packet(t0, 0, false, &rtt);
        acks.ack_now(t0);
        assert!(!acks.is_pending() && acks.deadline().is_none());
        acks.on_packet(t0, 1, true, &rtt);
        acks.ack_now(t0);
        assert!(acks.is_due(t0));
        assert_eq!(ack_written(&acks, t0).0, vec![(0, 1)]);
        assert!(acks.is_newest(2) && !acks.is_newest(1));
    }

    #[test]
    fn only_the_highest_ranges_are_kept() {
        let (t0, rtt) = (crate::test_epoch(), rtt_100ms());
        let mut acks = state();
        for pn in (0..200).step_by(2) {
            acks.on_packet(t0, pn, false, &rtt);
        }
        let (ranges, _) = ack_written(&acks, t0);
        assert_eq!(ranges.len(), ACK_RANGES_KEPT);
        assert_eq!(ranges[0], (198, 198));
        assert_eq!(ranges[ACK_RANGES_KEPT - 1], (136, 136));
    }
}
