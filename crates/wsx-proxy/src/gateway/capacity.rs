//! What the gateway's sessions may hold: descriptors under the open-file limit, and sessions
//! under the memory budget.
//!
//! A session through the tunnel holds one descriptor on each gateway (the client's socket on
//! the near side, the server's on the far side: the tunnel's one UDP socket is shared); a
//! session relayed directly holds two. An outbound session reserves two before its route is
//! known and gives one back once the tunnel carries it, so that no session fails halfway (its
//! server connect, or the next accept) for want of a descriptor: beyond what is left, new
//! sessions are refused at once, and interception pauses before that (see
//! `Inner::watch_capacity`).

use super::Gateway;
use crate::every::Every;
use crate::sys;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tracing::warn;

/// Descriptors left for the rest: the tunnel's socket, listeners, the API, timers, logs,
/// connections being accepted.
const DESCRIPTORS_RESERVED: u64 = 64;

/// Descriptors a session relayed directly holds: the client's socket and the server's.
pub(super) const DIRECT: usize = 2;

/// Descriptors a session carried by the tunnel holds on either gateway.
pub(super) const TUNNEL: usize = 1;

#[derive(Debug, Default)]
struct Held {
    descriptors: AtomicUsize,
    sessions: AtomicUsize,
}

/// The limits and what is held against them now.
#[derive(Debug)]
pub(super) struct Capacity {
    /// Descriptors sessions may hold: the open-file limit less [`DESCRIPTORS_RESERVED`].
    descriptors: usize,
    /// Sessions the memory budget carries.
    by_memory: usize,
    held: Arc<Held>,
    /// Refusals, logged at most every 10 s.
    refusals: Every,
}

/// A session's hold, given back when it drops.
#[derive(Debug)]
pub(super) struct Holding {
    held: Arc<Held>,
    descriptors: usize,
}

impl Holding {
    /// The session needs only `descriptors` from now on (its route is known).
    pub(super) fn keep(&mut self, descriptors: usize) {
        if descriptors < self.descriptors {
            let freed = self.descriptors - descriptors;
            self.held.descriptors.fetch_sub(freed, Ordering::Relaxed);
            self.descriptors = descriptors;
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.held
            .descriptors
            .fetch_sub(self.descriptors, Ordering::Relaxed);
        self.held.sessions.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Capacity {
    /// For the process's open-file limit (as it is now: the daemon raises it first), and at
    /// most `by_memory` sessions (what the memory budget carries).
    pub(super) fn new(by_memory: usize) -> Self {
        let limit = sys::descriptor_limit().unwrap_or(u64::MAX);
        Self::with_limits(limit, by_memory)
    }

    fn with_limits(open_file_limit: u64, by_memory: usize) -> Self {
        let descriptors = open_file_limit.saturating_sub(DESCRIPTORS_RESERVED);
        Self {
            descriptors: usize::try_from(descriptors).unwrap_or(usize::MAX).max(1),
            by_memory: by_memory.max(1),
            held: Arc::default(),
            refusals: Every::new(Duration::from_secs(10)),
        }
    }

    /// Sessions through the tunnel the limits carry.
    pub(super) fn sessions(&self) -> usize {
        (self.descriptors / TUNNEL).min(self.by_memory)
    }

    /// How full the fuller of the two limits is (1.0: full).
    pub(super) fn load(&self) -> f64 {
        let descriptors = self.held.descriptors.load(Ordering::Relaxed) as f64;
        let sessions = self.held.sessions.load(Ordering::Relaxed) as f64;
        (descriptors / self.descriptors as f64).max(sessions / self.by_memory as f64)
    }

    /// Sessions holding now.
    pub(super) fn holding(&self) -> usize {
        self.held.sessions.load(Ordering::Relaxed)
    }

    /// A hold of `descriptors` for one more session, if both limits have room for it.
    pub(super) fn hold(&self, descriptors: usize) -> Option<Holding> {
        let sessions = self.held.sessions.fetch_add(1, Ordering::Relaxed);
        let before = self
            .held
            .descriptors
            .fetch_add(descriptors, Ordering::Relaxed);
        let holding = Holding {
            held: self.held.clone(),
            descriptors,
        };
        // Over either limit: dropping the hold gives both back.
        (sessions < self.by_memory && before + descriptors <= self.descriptors).then_some(holding)
    }

    /// A session was refused for want of room: warns at most every 10 s.
    pub(super) fn refused(&self) {
        if let Some(refused) = self.refusals.tick(Instant::now()) {
            warn!(
                capacity = self.sessions(),
                refused,
                "at capacity (open files or memory budget): new sessions are refused at once \
                 (counts since the last warning); raise the open-file limit (LimitNOFILE) or \
                 memory_budget_mib"
            );
        }
    }
}

impl Gateway {
    /// How many sessions through the tunnel an open-file limit of `limit` descriptors
    /// carries (one each, some kept for the rest; a session relayed directly holds two).
    pub fn capacity_for(limit: u64) -> usize {
        Capacity::with_limits(limit, usize::MAX).sessions()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tunnel_session_gives_back_the_descriptor_it_did_not_need() {
        let capacity = Capacity::with_limits(DESCRIPTORS_RESERVED + 4, 100);
        assert_eq!(capacity.sessions(), 4);
        let mut first = capacity.hold(DIRECT).expect("room for two");
        let second = capacity.hold(DIRECT).expect("room for two more");
        assert!(
            capacity.hold(DIRECT).is_none(),
            "four descriptors are spent"
        );
        first.keep(TUNNEL);
        assert!(
            capacity.hold(DIRECT).is_none(),
            "one is left, a new session needs two"
        );
        let third = capacity.hold(TUNNEL).expect("one is left");
        assert_eq!(capacity.holding(), 3);
        assert!((capacity.load() - 1.0).abs() < 1e-9);
        drop((first, second, third));
        assert_eq!(capacity.holding(), 0);
        assert_eq!(capacity.load(), 0.0);
    }

    #[test]
    fn the_memory_budget_bounds_sessions_whatever_the_descriptors() {
        let capacity = Capacity::with_limits(1 << 20, 2);
        assert_eq!(capacity.sessions(), 2);
        let held: Vec<Holding> = (0..2).filter_map(|_| capacity.hold(TUNNEL)).collect();
        assert_eq!(held.len(), 2);
        assert!(capacity.hold(TUNNEL).is_none());
        assert_eq!(capacity.holding(), 2, "a refused hold takes nothing");
        assert!((capacity.load() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn capacity_for_the_usual_limits() {
        assert_eq!(Gateway::capacity_for(1024), 960);
        assert_eq!(Gateway::capacity_for(20_000), 19_936);
        assert_eq!(Gateway::capacity_for(1 << 20), (1 << 20) - 64);
        assert_eq!(Gateway::capacity_for(10), 1);
    }
}
