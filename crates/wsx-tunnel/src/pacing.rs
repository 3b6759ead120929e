//! The pacer: an earliest-departure-time schedule for bursts of packets.
//!
//! Each burst is about [`BURST_INTERVAL`] of data at the controller's rate — small enough that
//! a bottleneck queue absorbs it, large enough to be one GSO send (one syscall) — and the next
//! burst may leave when this one would have finished at the pacing rate. A sender that is
//! late (the driver was busy) may catch up by at most one burst interval, so it never
//! releases a window-sized burst after an idle period.

use std::time::{Duration, Instant};

/// Time's worth of data sent as one burst. Each burst costs the sender a timer wake-up (a
/// context switch, a timerfd read and re-arm, a `sendmsg`). 2 ms (as quinn's pacer) rather
/// than 1 ms halves them, and cut the sending gateway's CPU per GB at 100 Mbit/s by a fifth;
/// a 2 ms burst at 100 Mbit/s is 25 KB, which any bottleneck queue takes, and at high rates
/// the burst is bounded by `max_burst_packets` first.
pub(crate) const BURST_INTERVAL: Duration = Duration::from_millis(2);

#[derive(Debug, Default)]
pub(crate) struct Pacer {
    /// When the next burst may leave (None: now).
    next: Option<Instant>,
}

impl Pacer {
    /// When a burst may leave, if not now.
    pub(crate) fn delay(&self, now: Instant) -> Option<Instant> {
        self.next.filter(|&t| t > now)
    }

    /// When the next burst may leave, if a burst was sent.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.next
    }

    /// Bytes in one burst at `rate` bytes per second: [`BURST_INTERVAL`] worth, at least
    /// `min_bytes` and at most `max_bytes`.
    pub(crate) fn burst_bytes(rate: u64, min_bytes: u64, max_bytes: u64) -> u64 {
        crate::congestion::bytes_in(rate, BURST_INTERVAL).clamp(min_bytes, max_bytes.max(min_bytes))
    }

    /// A burst of `bytes` left at `now`, paced at `rate`.
    pub(crate) fn on_sent(&mut self, now: Instant, bytes: u64, rate: u64) {
        let earliest = now.checked_sub(BURST_INTERVAL).unwrap_or(now);
        let start = self.next.map_or(now, |t| t.max(earliest));
        let nanos = u128::from(bytes) * 1_000_000_000 / u128::from(rate.max(1));
        let nanos = u64::try_from(nanos).unwrap_or(u64::MAX);
        self.next = Some(start + Duration::from_nanos(nanos));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sending bursts whenever allowed for one second releases the rate's worth of bytes, to
    /// within one burst, whatever the burst size.
    #[test]
    fn long_run_rate_matches_the_pacing_rate() {
        let t0 = crate::test_epoch();
        for rate in [125_000u64, 12_500_000, 125_000_000] {
            let mut pacer = Pacer::default();
            let burst = Pacer::burst_bytes(rate, 2400, 64_000);
            let mut now = t0;
            let mut sent = 0;
            while now < t0 + Duration::from_secs(1) {
                if let Some(t) = pacer.delay(now) {
                    now = t;
                    continue;
                }
                pacer.on_sent(now, burst, rate);
                sent += burst;
            }
            assert!(sent.abs_diff(rate) <= burst, "rate {rate}: sent {sent}");
        }
    }

    #[test]
    fn idle_time_earns_at_most_one_burst_of_credit() {
        let t0 = crate::test_epoch();
        let mut pacer = Pacer::default();
        pacer.on_sent(t0, 2000, 1_000_000); // next at 2 ms
        let later = t0 + Duration::from_secs(1);
        assert_eq!(pacer.delay(later), None);
        pacer.on_sent(later, 2000, 1_000_000);
        // Started from `later - BURST_INTERVAL`, so the next may leave now...
        assert_eq!(pacer.delay(later), None);
        pacer.on_sent(later, 2000, 1_000_000);
        // ...but not a third time.
        assert_eq!(pacer.delay(later), Some(later + BURST_INTERVAL));
    }
}
