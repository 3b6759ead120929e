//! Warnings about things that can happen thousands of times a second (out of descriptors,
//! failing accepts): counted, and said at most once per interval with the count since.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Counts events and tells when the next may be logged.
#[derive(Debug)]
pub(crate) struct Every {
    every: Duration,
    /// When an event was last let through, and the events since (that one included).
    state: Mutex<(Option<Instant>, u64)>,
}

impl Every {
    pub(crate) const fn new(every: Duration) -> Self {
        Self {
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// Counts an event at `now`; `Some(count)` when it is to be logged, `count` being the
    /// events since the last one logged, this one included.
    pub(crate) fn tick(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (last, count) = &mut *state;
        *count += 1;
        if last.is_some_and(|at| now.saturating_duration_since(at) < self.every) {
            return None;
        }
        *last = Some(now);
        Some(std::mem::take(count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_in_each_interval_carries_the_count() {
        let every = Every::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(every.tick(t0), Some(1));
        for s in 1..10 {
            assert_eq!(every.tick(t0 + Duration::from_secs(s)), None);
        }
        assert_eq!(every.tick(t0 + Duration::from_secs(10)), Some(10));
        assert_eq!(every.tick(t0 + Duration::from_secs(11)), None);
    }
}
