//! The connection's timers: each has a deadline or none, gathered into a table from the
//! state that sets them, so that `poll_timeout` is the table's earliest deadline and
//! `handle_timeout` acts on exactly the timers that expired, in the order of [`Timer`].

use std::time::Instant;

/// What a deadline is for; `handle_timeout` serves expired timers in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    /// Closing or draining ends, or the handshake gives up: the connection is over.
    Close,
    /// The initiator sends its initiation again.
    HandshakeRetry,
    /// Nothing heard from the peer for the idle timeout.
    Idle,
    /// Loss detection by time, or a probe timeout (RFC 9002 §6).
    LossDetection,
    /// An ACK is due.
    Ack,
    /// Nothing sent for the keepalive interval: a PING is due.
    KeepAlive,
    /// The pacer lets the next burst leave (nothing to do but transmit).
    Pacing,
    /// The open FEC block must be coded.
    FecFlush,
    /// Streams holding buffers are checked for idle ones to give back.
    BufferSweep,
}

impl Timer {
    const COUNT: usize = 9;
    const ALL: [Timer; Self::COUNT] = [
        Timer::Close,
        Timer::HandshakeRetry,
        Timer::Idle,
        Timer::LossDetection,
        Timer::Ack,
        Timer::KeepAlive,
        Timer::Pacing,
        Timer::FecFlush,
        Timer::BufferSweep,
    ];
}

/// A deadline per [`Timer`].
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct TimerTable {
    deadlines: [Option<Instant>; Timer::COUNT],
}

impl TimerTable {
    pub(super) fn set(&mut self, timer: Timer, at: Option<Instant>) {
        self.deadlines[timer as usize] = at;
    }

    pub(super) fn get(&self, timer: Timer) -> Option<Instant> {
        self.deadlines[timer as usize]
    }

    /// The earliest deadline.
    pub(super) fn next(&self) -> Option<Instant> {
        self.deadlines.iter().flatten().min().copied()
    }

    /// The timers due at `now`, in the order they are served.
    pub(super) fn expired(&self, now: Instant) -> impl Iterator<Item = Timer> + '_ {
        Timer::ALL
            .into_iter()
            .filter(move |&t| self.get(t).is_some_and(|at| at <= now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_earliest_deadline_and_the_expired_timers_in_order() {
        let t0 = crate::test_epoch();
        let ms = Duration::from_millis(1);
        let mut table = TimerTable::default();
        assert_eq!(table.next(), None);
        table.set(Timer::FecFlush, Some(t0 + ms));
        table.set(Timer::Idle, Some(t0 + 30 * ms));
        table.set(Timer::Ack, Some(t0 + 5 * ms));
        table.set(Timer::LossDetection, Some(t0 + 2 * ms));
        assert_eq!(table.next(), Some(t0 + ms));
        let due: Vec<_> = table.expired(t0 + 5 * ms).collect();
        assert_eq!(due, [Timer::LossDetection, Timer::Ack, Timer::FecFlush]);
        table.set(Timer::FecFlush, None);
        assert_eq!(table.next(), Some(t0 + 2 * ms));
        assert_eq!(table.expired(t0).count(), 0);
    }
}
