//! Delivery-rate estimation, after draft-cheng-iccrg-delivery-rate-estimation-02 (the
//! mechanism in Linux TCP that BBR reads).
//!
//! Each packet records, when sent, how many bytes had been delivered and when. When it is
//! acknowledged, the bytes delivered since then over the time elapsed is the rate the path
//! delivered at. Taking the longer of the send and ACK intervals (§3.3) keeps a burst of
//! coalesced ACKs — wsx acknowledges every few dozen packets — from inflating the sample.

use super::{RateSample, rate_of};
use std::time::{Duration, Instant};

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
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    prior_delivered: u64,
    prior_time: Instant,
    send_elapsed: Duration,
    app_limited: bool,
}

impl DeliveryRate {
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            delivered: 0,
            delivered_time: now,
            first_sent_time: now,
            app_limited_until: 0,
            pending: None,
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
            });
            self.first_sent_time = sent;
        }
    }

    /// What the ACK frame just processed delivered, if it acknowledged anything: the delivered
    /// count when its newest packet was sent, and a rate sample. Samples over less than
    /// `min_rtt` are dropped: they measure a burst, not the path (§3.3).
    pub(crate) fn take_sample(&mut self, min_rtt: Duration) -> Option<(u64, Option<RateSample>)> {
        let p = self.pending.take()?;
        let ack_elapsed = self.delivered_time.saturating_duration_since(p.prior_time);
        let interval = p.send_elapsed.max(ack_elapsed);
        if interval < min_rtt || interval.is_zero() {
            return Some((p.prior_delivered, None));
        }
        let bytes = self.delivered - p.prior_delivered;
        let sample = RateSample {
            rate: rate_of(bytes, interval),
            interval,
            app_limited: p.app_limited,
        };
        Some((p.prior_delivered, Some(sample)))
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
                samples.extend(d.take_sample(ms(50)).and_then(|(_, s)| s));
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
        let (prior, s) = d.take_sample(Duration::from_millis(10)).unwrap();
        assert!(s.unwrap().app_limited);
        assert_eq!((prior, d.delivered()), (0, 2000));
    }
}
