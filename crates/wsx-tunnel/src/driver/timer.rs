//! The driver's wake-up timer: a `timerfd` registered with tokio's reactor.
//!
//! Pacing releases a burst every 2 ms or less (`pacing::BURST_INTERVAL`). tokio's own
//! timer wheel has millisecond granularity and rounds deadlines up, so bursts would leave up
//! to half an interval late and the pacer's catch-up allowance would be used up by the timer
//! alone. A timerfd fires at the requested nanosecond (within the kernel's hrtimer slack,
//! ~50 µs by default) and wakes the same epoll loop as the socket.

use std::io;
use std::time::{Duration, Instant};
use timerfd::{ClockId, SetTimeFlags, TimerFd, TimerState};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// The shortest delay armed: a zero duration would disarm a timerfd instead of firing it.
const MIN_DELAY: Duration = Duration::from_micros(1);

/// A one-shot timer with nanosecond resolution (a timerfd on tokio's reactor). The driver
/// paces with it; the gateway's shaper serves its direct relays with it, for the same reason.
#[derive(Debug)]
pub struct Timer {
    fd: AsyncFd<TimerFd>,
    /// The deadline set, so that an unchanged one costs no system call.
    armed: Option<Instant>,
}

impl Timer {
    pub fn new() -> io::Result<Self> {
        let fd = TimerFd::new_custom(ClockId::Monotonic, true, true)?;
        // SAFETY: a `TimerFd` owns its descriptor, keeps it open until it is dropped, and
        // always reports the same one; the `AsyncFd` owns the `TimerFd`.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }?;
        Ok(Self { fd, armed: None })
    }

    /// Fires once at `deadline` (replacing any earlier setting). The timerfd takes a delay,
    /// counted from the clock read here: from a time read earlier, it would fire late by
    /// whatever ran in between.
    pub fn arm(&mut self, deadline: Instant) {
        if self.armed == Some(deadline) {
            return;
        }
        self.armed = Some(deadline);
        let delay = deadline
            .saturating_duration_since(super::now())
            .max(MIN_DELAY);
        self.fd
            .get_mut()
            .set_state(TimerState::Oneshot(delay), SetTimeFlags::Default);
    }

    pub fn disarm(&mut self) {
        if self.armed.take().is_some() {
            self.fd
                .get_mut()
                .set_state(TimerState::Disarmed, SetTimeFlags::Default);
        }
    }

    /// Completes when the armed time has come. Never completes while disarmed.
    pub async fn expired(&mut self) -> io::Result<()> {
        loop {
            let mut guard = self.fd.readable().await?;
            // Non-blocking read: 0 when the readiness was stale (the timer was re-armed after
            // it fired, which clears its count).
            let expirations = guard.get_inner().read();
            guard.clear_ready();
            if expirations > 0 {
                self.armed = None;
                return Ok(());
            }
        }
    }
}
