//! Round-trip time estimation (RFC 9002 §5).

use std::time::Duration;

/// RTT assumed before the first sample (RFC 9002 §6.2.2 uses 333 ms; the handshake gives a
/// sample before any data is sent, so this only matters when the handshake is skipped in
/// tests).
pub(crate) const INITIAL_RTT: Duration = Duration::from_millis(333);
/// Timer granularity (RFC 9002 §6.1.2).
pub(crate) const GRANULARITY: Duration = Duration::from_millis(1);

#[derive(Debug, Clone, Copy)]
pub struct RttEstimator {
    latest: Duration,
    smoothed: Option<Duration>,
    var: Duration,
    min: Duration,
}

impl RttEstimator {
    pub(crate) fn new(initial: Duration) -> Self {
        Self {
            latest: initial,
            smoothed: None,
            var: initial / 2,
            min: initial,
        }
    }

    /// The most recent sample.
    pub fn latest(&self) -> Duration {
        self.latest
    }

    /// The smoothed RTT.
    pub fn smoothed(&self) -> Duration {
        self.smoothed.unwrap_or(self.latest)
    }

    /// The smallest sample seen: the path's propagation delay plus whatever queue it never
    /// drains.
    pub fn min(&self) -> Duration {
        self.min
    }

    pub fn var(&self) -> Duration {
        self.var
    }

    /// Whether any sample was taken.
    pub fn has_sample(&self) -> bool {
        self.smoothed.is_some()
    }

    /// Adds a sample. `ack_delay` (the time the peer held the acknowledgement) is subtracted
    /// when that does not go below the minimum (RFC 9002 §5.3).
    pub(crate) fn update(&mut self, sample: Duration, ack_delay: Duration) {
        self.latest = sample;
        let Some(smoothed) = self.smoothed else {
            self.min = sample;
            self.smoothed = Some(sample);
            self.var = sample / 2;
            return;
        };
        self.min = self.min.min(sample);
        let adjusted = if sample >= self.min + ack_delay {
            sample - ack_delay
        } else {
            sample
        };
        let deviation = smoothed.abs_diff(adjusted);
        self.var = (self.var * 3 + deviation) / 4;
        self.smoothed = Some((smoothed * 7 + adjusted) / 8);
    }

    /// The probe timeout before backoff (RFC 9002 §6.2.1).
    pub(crate) fn pto_base(&self) -> Duration {
        self.smoothed() + (self.var * 4).max(GRANULARITY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_rfc9002() {
        let ms = Duration::from_millis;
        let mut rtt = RttEstimator::new(INITIAL_RTT);
        rtt.update(ms(100), ms(0));
        assert_eq!(
            (rtt.smoothed(), rtt.var(), rtt.min()),
            (ms(100), ms(50), ms(100))
        );
        rtt.update(ms(120), ms(10));
        // adjusted = 110; var = (150 + 10) / 4 = 40; smoothed = (700 + 110) / 8.
        assert_eq!(rtt.var(), ms(40));
        assert_eq!(rtt.smoothed(), Duration::from_micros(101_250));
        // An ack delay that would go below min is not subtracted.
        rtt.update(ms(101), ms(50));
        assert_eq!(rtt.latest(), ms(101));
        assert_eq!(rtt.min(), ms(100));
    }
}
