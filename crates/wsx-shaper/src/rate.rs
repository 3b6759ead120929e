//! Rates, and the clock that holds a sender to one.
//!
//! A [`Rate`] is bits per second, as operators write them (`"20 Mbit/s"`). A `RateClock` is
//! an earliest-departure-time clock: sending `b` bytes moves the time the next byte may leave
//! on by exactly `b / rate`, with the remainder of the division kept, so that no rounding
//! accumulates over a run (at 10 Gbit/s one packet is 1.2 µs; rounding each to whole
//! nanoseconds would be an error of up to 0.08 %).

use std::fmt;
use std::str::FromStr;

/// Nanoseconds since the shaper's epoch: the core's time.
pub(crate) type Nanos = u64;

const NANOS_PER_SECOND: u128 = 1_000_000_000;

/// A caller held back by a rate waits at least this long before it asks again
/// (`Shaper::poll_timeout`), and then finds that much of the rate owed, which its clocks
/// let through at once: one burst per wake-up instead of one turn. At 200 Mbit/s a turn of
/// 2,896 bytes lasts 116 µs, so a tunnel would otherwise wake up 8,600 times a second; this
/// makes it about 2,000. The price is smoothness at the millisecond above about 46 Mbit/s
/// (where a turn lasts less than this): a millisecond may carry up to half a millisecond of
/// the rate more than its share, as the tunnel's own pacing bursts do.
pub const WAKE_GAP: std::time::Duration = std::time::Duration::from_micros(500);

/// How far behind the present a continuously busy clock may fall and still catch up: a
/// scheduler woken up to this late sends what it owes at once, so late wake-ups cost no rate.
/// After an idle spell a clock restarts at the present instead (no credit for idling), so the
/// largest burst above the rate is this long at the rate. It is the [`WAKE_GAP`] a held
/// caller is asked to wait, and 2 ms of timer lateness on top: wake-ups in the drivers are
/// late by well under a millisecond, 2 ms covers the worst seen on a loaded 2-core machine.
pub const CATCH_UP: std::time::Duration = std::time::Duration::from_micros(2_500);
const CATCH_UP_NANOS: Nanos = CATCH_UP.as_nanos() as Nanos;

/// A rate in bits per second, from [`Rate::MIN`] to [`Rate::MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rate(u64);

impl Rate {
    /// 10 kbit/s.
    pub const MIN: Rate = Rate(10_000);
    /// 10 Gbit/s.
    pub const MAX: Rate = Rate(10_000_000_000);

    /// `bits` per second, if within [`Rate::MIN`]..=[`Rate::MAX`].
    pub fn from_bits_per_second(bits: u64) -> Option<Rate> {
        (Self::MIN.0..=Self::MAX.0)
            .contains(&bits)
            .then_some(Rate(bits))
    }

    /// `n` Mbit/s (clamped to the valid range; for tests and defaults).
    pub fn mbit(n: u64) -> Rate {
        Rate(n.saturating_mul(1_000_000).clamp(Self::MIN.0, Self::MAX.0))
    }

    pub fn bits_per_second(self) -> u64 {
        self.0
    }

    /// Bytes per second, rounded down (never zero: the minimum is 1,250).
    pub fn bytes_per_second(self) -> u64 {
        self.0 / 8
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (value, unit) = match self.0 {
            b if b >= 1_000_000_000 && b % 1_000_000 == 0 => (b as f64 / 1e9, "Gbit/s"),
            b if b >= 1_000_000 && b % 1_000 == 0 => (b as f64 / 1e6, "Mbit/s"),
            b if b >= 1_000 => (b as f64 / 1e3, "kbit/s"),
            b => (b as f64, "bit/s"),
        };
        write!(f, "{value} {unit}")
    }
}

/// Why a rate did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    /// Not a number followed by a unit.
    #[error("expected a rate such as \"20 Mbit/s\", \"512 kbit/s\" or \"1.5 Gbit/s\"")]
    Syntax,
    /// A unit other than bit/s, kbit/s, Mbit/s, Gbit/s (or their short forms).
    #[error("unknown unit {0:?}: use bit/s, kbit/s, Mbit/s or Gbit/s")]
    Unit(String),
    /// Below 10 kbit/s or above 10 Gbit/s.
    #[error("{0} bit/s is outside 10 kbit/s to 10 Gbit/s")]
    Range(u128),
}

impl FromStr for Rate {
    type Err = RateError;

    /// `"20 Mbit/s"`, `"20Mbit"`, `"1.5 Gbit/s"`, `"512 kbps"`, `"64000 bit/s"`. Units are
    /// decimal (k = 1,000) and in bits; a bare number is refused, because bytes or bits would
    /// be a guess.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or(RateError::Syntax)?;
        let (number, unit) = text.split_at(split);
        let multiplier: u128 = match unit.trim() {
            "bit/s" | "bps" | "bit" => 1,
            "kbit/s" | "kbps" | "kbit" => 1_000,
            "Mbit/s" | "Mbps" | "mbit" | "Mbit" => 1_000_000,
            "Gbit/s" | "Gbps" | "gbit" | "Gbit" => 1_000_000_000,
            other => return Err(RateError::Unit(other.to_owned())),
        };
        let bits = parse_decimal(number, multiplier).ok_or(RateError::Syntax)?;
        u64::try_from(bits)
            .ok()
            .and_then(Rate::from_bits_per_second)
            .ok_or(RateError::Range(bits))
    }
}

/// `number × multiplier` for a decimal `number` with at most 9 fractional digits, exactly;
/// `None` if it is not a number or has too many digits.
fn parse_decimal(number: &str, multiplier: u128) -> Option<u128> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || fraction.len() > 9 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u128 = whole.parse().ok()?;
    let scale = 10u128.pow(fraction.len() as u32);
    let fraction: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().ok()?
    };
    let value = whole.checked_mul(scale)?.checked_add(fraction)?;
    let bits = value.checked_mul(multiplier)?;
    (bits % scale == 0).then_some(bits / scale)
}

/// An earliest-departure-time clock at a fixed rate: [`RateClock::next`] is when the next
/// byte may leave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RateClock {
    /// Bytes per second.
    bytes_per_second: u64,
    next: Nanos,
    /// The part of a nanosecond owed, in units of 1/`bytes_per_second` ns.
    remainder: u64,
}

impl RateClock {
    pub(crate) fn new(rate: Rate) -> Self {
        Self {
            bytes_per_second: rate.bytes_per_second(),
            next: 0,
            remainder: 0,
        }
    }

    /// When the next byte may leave.
    pub(crate) fn next(&self) -> Nanos {
        self.next
    }

    pub(crate) fn ready(&self, now: Nanos) -> bool {
        self.next <= now
    }

    /// The sender became busy after an idle spell: no credit for the time it was idle.
    pub(crate) fn restart(&mut self, now: Nanos) {
        if self.next < now {
            self.next = now;
            self.remainder = 0;
        }
    }

    /// `bytes` left at `now`: the next departure moves on by their time at the rate, from
    /// the last departure time if that is at most [`CATCH_UP`] ago (a late wake-up is made
    /// up), else from `CATCH_UP` ago.
    pub(crate) fn charge(&mut self, bytes: u64, now: Nanos) {
        let floor = now.saturating_sub(CATCH_UP_NANOS);
        if self.next < floor {
            self.next = floor;
            self.remainder = 0;
        }
        self.advance(bytes);
    }

    /// As [`charge`](Self::charge), but the clock never runs more than these bytes' time
    /// ahead of `now`: used for minimums, which are a floor, so that service above the
    /// minimum is not held against the sender when it next falls back to it.
    pub(crate) fn charge_floor(&mut self, bytes: u64, now: Nanos) {
        if self.next > now {
            self.next = now;
            self.remainder = 0;
        }
        self.charge(bytes, now);
    }

    fn advance(&mut self, bytes: u64) {
        let owed = u128::from(bytes) * NANOS_PER_SECOND + u128::from(self.remainder);
        let rate = u128::from(self.bytes_per_second);
        // Both fit: a u64 of bytes at ≥ 1,250 B/s is < 2^64 × 8e5 ns, but the clock would
        // overflow long before; saturate rather than wrap.
        let step = u64::try_from(owed / rate).unwrap_or(u64::MAX);
        self.next = self.next.saturating_add(step);
        self.remainder = (owed % rate) as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_in_decimal_bits() {
        let parse = |s: &str| s.parse::<Rate>().map(Rate::bits_per_second);
        assert_eq!(parse("20 Mbit/s"), Ok(20_000_000));
        assert_eq!(parse("20Mbit"), Ok(20_000_000));
        assert_eq!(parse("1.5 Gbit/s"), Ok(1_500_000_000));
        assert_eq!(parse("512 kbps"), Ok(512_000));
        assert_eq!(parse("10 kbit/s"), Ok(10_000));
        assert_eq!(parse("10 Gbit/s"), Ok(10_000_000_000));
        assert_eq!(parse("0.125 Mbit/s"), Ok(125_000));
        assert_eq!(parse("20"), Err(RateError::Syntax));
        assert_eq!(parse("Mbit/s"), Err(RateError::Syntax));
        assert_eq!(parse("1.2.3 Mbit/s"), Err(RateError::Syntax));
        assert_eq!(parse("20 MB/s"), Err(RateError::Unit("MB/s".into())));
        assert_eq!(parse("9 kbit/s"), Err(RateError::Range(9_000)));
        assert_eq!(parse("10.5 Gbit/s"), Err(RateError::Range(10_500_000_000)));
        assert_eq!(parse("0.0000000001 bit/s"), Err(RateError::Syntax));
    }

    #[test]
    fn rates_print_as_written() {
        for text in [
            "20 Mbit/s",
            "1.5 Gbit/s",
            "512 kbit/s",
            "10 Gbit/s",
            "1.25 Mbit/s",
        ] {
            let rate: Rate = text.parse().unwrap();
            assert_eq!(rate.to_string(), text);
        }
    }

    #[test]
    fn the_clock_keeps_the_remainder() {
        // 3 bytes at 8 kbit/s... is below the minimum; use 10 kbit/s = 1,250 B/s: one byte is
        // 800 µs exactly, and 7 bytes at 1,500 B/s (12 kbit/s) are 4.666… ms.
        let mut clock = RateClock::new(Rate::from_bits_per_second(12_000).unwrap());
        for _ in 0..3 {
            clock.charge(7, 0);
        }
        // 21 bytes at 1,500 B/s = 14 ms exactly, with nothing lost to rounding.
        assert_eq!(clock.next(), 14_000_000);
        assert_eq!(clock.remainder, 0);
    }

    #[test]
    fn a_late_sender_catches_up_only_so_far() {
        let mut clock = RateClock::new(Rate::mbit(8)); // 1 byte per µs
        clock.charge(1000, 0);
        assert_eq!(clock.next(), 1_000_000);
        // Woken 1.5 ms late: the 1 ms owed is made up, counted from the last departure.
        clock.charge(1000, 2_500_000);
        assert_eq!(clock.next(), 2_000_000);
        // Woken 10 ms late: only CATCH_UP is made up.
        clock.charge(1000, 12_000_000);
        assert_eq!(clock.next(), 12_000_000 - CATCH_UP_NANOS + 1_000_000);
        // After idling, no credit at all.
        clock.restart(50_000_000);
        assert_eq!(clock.next(), 50_000_000);
    }

    #[test]
    fn a_floor_clock_never_runs_ahead() {
        let mut clock = RateClock::new(Rate::mbit(8));
        for _ in 0..100 {
            clock.charge_floor(1000, 0);
        }
        assert_eq!(clock.next(), 1_000_000, "one charge ahead of now at most");
    }
}
