//! Delivery-rate estimation, after draft-cheng-iccrg-delivery-rate-estimation-02 (the
//! mechanism in Linux TCP that BBR reads).
//!
//! Each packet records, when sent, how many bytes had been delivered and when. When it is
//! acknowledged, the bytes delivered since then over the time elapsed is the rate the path
//! delivered at. Taking the longer of the send and ACK intervals (§3.3) keeps a burst of
//! coalesced ACKs — wsx acknowledges every few dozen packets — from inflating the sample.
//!
//! **Flights after idle.** A flight shorter than a round trip (an answer to a request) is
//! sent before any of it is acknowledged, so every sample of it runs from its first packet's
//! departure and includes the whole round trip: it measures how much the application sent
//! per round trip, never what the path can carry, and a pacing rate learnt from it keeps the
//! next answer as slow. Such a flight is also timed where it arrives: the receiver
//! acknowledges the first packet after a quiet spell at once, and every ACK says how long the
//! receiver held its newest packet, so two ACKs give the arrival times of the flight's start
//! and of its newest packet so far. The bytes between over the longer of that spread and the
//! same packets' send spread is a rate the path demonstrably carried (the bottleneck cannot
//! deliver faster than it serves) that never exceeds the pacing rate; the larger of the two
//! samples is taken. The flight's timing ends once a packet sent after its first ACK is
//! acknowledged: ordinary samples then measure the path.

use super::{RateSample, rate_of};
use std::time::{Duration, Instant};

/// The shortest arrival spread a flight's timing is taken over: below it the receiver's
/// batched reads (one timestamp for a batch of datagrams) are a large part of the spread.
const MIN_FLIGHT_SPREAD: Duration = Duration::from_millis(2);

/// What a packet remembers of the delivery state when it was sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PacketSnapshot {
    delivered: u64,
    delivered_time: Instant,
    first_sent_time: Instant,
    app_limited: bool,
}

#[derive(Debug)]
pub(crate) struct DeliveryRate {
    delivered: u64,
    delivered_time: Instant,
    first_sent_time: Instant,
    /// Delivered-count up to which samples are app-limited (0: not app-limited).
    app_limited_until: u64,
    /// The sample being assembled from one ACK frame.
    pending: Option<Pending>,
    /// The flight sent after idle being timed at the receiver, if any.
    flight: Option<Flight>,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    prior_delivered: u64,
    prior_time: Instant,
    send_elapsed: Duration,
    app_limited: bool,
    /// When the newest packet acknowledged was sent.
    newest_sent: Instant,
}

/// A flight that began after idle (see the module documentation).
#[derive(Debug, Clone, Copy)]
struct Flight {
    /// The delivered count when it began: packets sent before are not its own.
    start: u64,
    /// Its first ACK: the delivered count after it, when the receiver got the newest packet
    /// it acknowledged, and when that packet was sent.
    first: Option<(u64, Instant, Instant)>,
}

impl DeliveryRate {
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            delivered: 0,
            delivered_time: now,
            first_sent_time: now,
            app_limited_until: 0,
            pending: None,
            flight: None,
        }
    }

    /// Total bytes acknowledged.
    pub(crate) fn delivered(&self) -> u64 {
        self.delivered
    }

    /// Call before sending a packet; `in_flight` excludes it.
    pub(crate) fn on_sent(&mut self, now: Instant, in_flight: u64) -> PacketSnapshot {
        if in_flight == 0 {
            // Start of a flight after idle: intervals start now, not at the last ACK.
            self.first_sent_time = now;
            self.delivered_time = now;
            self.flight = Some(Flight {
                start: self.delivered,
                first: None,
            });
        }
        PacketSnapshot {
            delivered: self.delivered,
            delivered_time: self.delivered_time,
            first_sent_time: self.first_sent_time,
            app_limited: self.app_limited_until > 0,
        }
    }

    /// The sender ran out of data with `in_flight` bytes outstanding: samples until those are
    /// delivered measure the application, not the path.
    pub(crate) fn on_app_limited(&mut self, in_flight: u64) {
        self.app_limited_until = (self.delivered + in_flight).max(1);
    }

    /// A packet of `bytes`, sent at `sent` with `snapshot`, was acknowledged.
    pub(crate) fn on_acked(
        &mut self,
        now: Instant,
        bytes: u64,
        sent: Instant,
        snapshot: &PacketSnapshot,
    ) {
        self.delivered += bytes;
        self.delivered_time = now;
        if self.app_limited_until > 0 && self.delivered > self.app_limited_until {
            self.app_limited_until = 0;
        }
        let newer = self
            .pending
            .is_none_or(|p| snapshot.delivered >= p.prior_delivered);
        if newer {
            self.pending = Some(Pending {
                prior_delivered: snapshot.delivered,
                prior_time: snapshot.delivered_time,
                send_elapsed: sent.saturating_duration_since(snapshot.first_sent_time),
                app_limited: snapshot.app_limited,
                newest_sent: sent,
            });
            self.first_sent_time = sent;
        }
    }

    /// What the ACK frame just processed delivered, if it acknowledged anything: the delivered
    /// count when its newest packet was sent, and a rate sample. Samples over less than
    /// `min_rtt` are dropped: they measure a burst, not the path (§3.3). `received_at` is
    /// when the peer received the newest packet the frame acknowledged (the frame's arrival
    /// less the delay the peer reports), which times a flight after idle at the receiver.
    pub(crate) fn take_sample(
        &mut self,
        min_rtt: Duration,
        received_at: Instant,
    ) -> Option<(u64, Option<RateSample>)> {
        let p = self.pending.take()?;
        let flight = self.flight_rate(&p, received_at);
        let ack_elapsed = self.delivered_time.saturating_duration_since(p.prior_time);
        let interval = p.send_elapsed.max(ack_elapsed);
        let sample = (interval >= min_rtt && !interval.is_zero()).then(|| RateSample {
            rate: rate_of(self.delivered - p.prior_delivered, interval),
            interval,
            app_limited: p.app_limited,
        });
        let sample = match (sample, flight) {
            (Some(s), Some((rate, _))) if s.rate >= rate => Some(s),
            (_, Some((rate, interval))) => Some(RateSample {
                rate,
                interval,
                app_limited: p.app_limited,
            }),
            (s, None) => s,
        };
        Some((p.prior_delivered, sample))
    }

    /// The rate at which the flight after idle, if one is being timed, arrived up to this
    /// ACK, and the interval it was taken over.
    fn flight_rate(&mut self, p: &Pending, received_at: Instant) -> Option<(u64, Duration)> {
        let flight = self.flight.as_mut()?;
        if p.prior_delivered < flight.start {
            // An ACK of packets sent before the flight.
            return None;
        }
        let Some((first_delivered, first_received, first_sent)) = flight.first else {
            flight.first = Some((self.delivered, received_at, p.newest_sent));
            return None;
        };
        if p.prior_delivered >= first_delivered {
            // Sent after the flight's first ACK arrived: ordinary samples time it now.
            self.flight = None;
            return None;
        }
        let spread = received_at
            .saturating_duration_since(first_received)
            .max(p.newest_sent.saturating_duration_since(first_sent));
        let bytes = self.delivered - first_delivered;
        (spread >= MIN_FLIGHT_SPREAD && bytes > 0).then(|| (rate_of(bytes, spread), spread))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sender pacing one 1000-byte packet per millisecond over a 50 ms path, acknowledged in
    /// batches of ten, measures 1 MB/s.
    #[test]
    fn paced_flow_with_coalesced_acks_measures_the_pacing_rate() {
        let t0 = crate::test_epoch();
        let ms = Duration::from_millis;
        let mut d = DeliveryRate::new(t0);
        let mut sent = Vec::new();
        let mut samples = Vec::new();
        let mut in_flight = 0;
        for i in 0..400u64 {
            let now = t0 + ms(i);
            // ACKs for packets sent 50 ms ago, delivered in batches of ten.
            if i >= 50 && i % 10 == 0 {
                for (at, snap) in sent.drain(..10) {
                    d.on_acked(now, 1000, at, &snap);
                    in_flight -= 1000;
                }
                samples.extend(d.take_sample(ms(50), now).and_then(|(_, s)| s));
            }
            sent.push((now, d.on_sent(now, in_flight)));
            in_flight += 1000;
        }
        assert!(samples.len() > 20);
        for s in &samples[5..] {
            // 1,000,000 B/s, within the granularity of one batch.
            assert!((950_000..=1_050_000).contains(&s.rate), "{s:?}");
            assert!(!s.app_limited);
        }
    }

    #[test]
    fn samples_after_running_out_of_data_are_app_limited() {
        let t0 = crate::test_epoch();
        let mut d = DeliveryRate::new(t0);
        let snap = d.on_sent(t0, 0);
        d.on_app_limited(1000);
        let snap2 = d.on_sent(t0, 1000);
        let later = t0 + Duration::from_millis(100);
        d.on_acked(later, 1000, t0, &snap);
        d.on_acked(later, 1000, t0, &snap2);
        let (prior, s) = d.take_sample(Duration::from_millis(10), later).unwrap();
        assert!(s.unwrap().app_limited);
        assert_eq!((prior, d.delivered()), (0, 2000));
    }
}
