//! SMB on the gateway: every session through a tunnel to TCP port 445 of a peer with `smb`
//! on is watched by `wsx-smb`'s observer as the relay copies it, and the gateway counts
//! what the observer concludes (`Gateway::smb`).
//!
//! The observer reads the bytes the relay has just read, in its buffer, before they are
//! written on: no copy, no delay, and nothing is changed. Both gateways of a session watch
//! it, each counting what it relays.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::info;
use wsx_smb::{Direction, Observer, ReadStats, Reason, Verdict};

/// The port SMB2/3 runs on (Direct TCP, MS-SMB2 2.1).
pub(crate) const PORT: u16 = 445;

/// What the gateway's observers concluded, since start.
#[derive(Debug, Default)]
pub(crate) struct SmbTotals {
    sessions: AtomicU64,
    unsigned: AtomicU64,
    /// Indexed by [`Reason::index`].
    passed_through: [AtomicU64; Reason::NAMES.len()],
    reads: AtomicU64,
    read_bytes: AtomicU64,
    reads_alone: AtomicU64,
}

/// What the gateway's SMB observers concluded, since start ([`crate::Gateway::smb`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SmbStats {
    /// Sessions to port 445 watched (peers with `smb` on, through the tunnel).
    pub sessions: u64,
    /// Of those, sessions that connected a share with nothing signed or encrypted: the
    /// ones the read-ahead engine may serve. One signed later counts here and below.
    pub unsigned: u64,
    /// Sessions relayed byte for byte for good, by reason, in [`Reason::NAMES`] order.
    pub passed_through: Vec<(&'static str, u64)>,
    /// READ requests in the sessions watched, until a session passed through.
    pub reads: u64,
    /// The bytes they asked for.
    pub read_bytes: u64,
    /// READs sent while no other READ of their session was in flight: each waited a whole
    /// round trip, which is what read-ahead takes away.
    pub reads_alone: u64,
}

impl SmbTotals {
    pub(crate) fn snapshot(&self) -> SmbStats {
        SmbStats {
            sessions: self.sessions.load(Ordering::Relaxed),
            unsigned: self.unsigned.load(Ordering::Relaxed),
            passed_through: Reason::NAMES
                .iter()
                .zip(&self.passed_through)
                .map(|(&name, n)| (name, n.load(Ordering::Relaxed)))
                .collect(),
            reads: self.reads.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            reads_alone: self.reads_alone.load(Ordering::Relaxed),
        }
    }
}

/// One session's observer and the totals it reports to.
#[derive(Debug)]
pub(crate) struct Watch {
    observer: Observer,
    totals: Arc<SmbTotals>,
    /// The session was counted as unsigned.
    counted_unsigned: bool,
    /// The observer's READs already added to the totals.
    counted_reads: ReadStats,
}

impl Watch {
    /// Starts watching a session (counted at once).
    pub(crate) fn new(totals: Arc<SmbTotals>) -> Self {
        totals.sessions.fetch_add(1, Ordering::Relaxed);
        Self {
            observer: Observer::new(),
            totals,
            counted_unsigned: false,
            counted_reads: ReadStats::default(),
        }
    }

    /// The relay read `data` from the client's side (`to_server`) or the server's.
    pub(crate) fn read(&mut self, to_server: bool, data: &[u8]) {
        let direction = if to_server {
            Direction::ToServer
        } else {
            Direction::ToClient
        };
        let changed = self.observer.feed(direction, data);
        let dialect = || self.observer.dialect().map(|d| d.to_string());
        // Before the pass-through the same read may have brought.
        if self.observer.was_unsigned() && !self.counted_unsigned {
            self.counted_unsigned = true;
            self.totals.unsigned.fetch_add(1, Ordering::Relaxed);
            info!(dialect = dialect(), "SMB session unsigned");
        }
        let reads = self.observer.reads();
        if reads != self.counted_reads {
            let old = std::mem::replace(&mut self.counted_reads, reads);
            let add = |counter: &AtomicU64, now: u64, before: u64| {
                counter.fetch_add(now - before, Ordering::Relaxed);
            };
            add(&self.totals.reads, reads.reads, old.reads);
            add(&self.totals.read_bytes, reads.bytes, old.bytes);
            add(&self.totals.reads_alone, reads.alone, old.alone);
        }
        if let Some(Verdict::PassThrough(reason)) = changed {
            self.totals.passed_through[reason.index()].fetch_add(1, Ordering::Relaxed);
            info!(dialect = dialect(), %reason, "SMB session passes through");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_that_is_not_smb_is_counted_as_passed_through() {
        let totals = Arc::new(SmbTotals::default());
        let mut watch = Watch::new(totals.clone());
        watch.read(true, b"GET / HTTP/1.1\r\n");
        watch.read(false, b"anything");
        let stats = totals.snapshot();
        assert_eq!(stats.sessions, 1);
        assert_eq!(stats.unsigned, 0);
        let counted: Vec<_> = stats
            .passed_through
            .iter()
            .filter(|(_, n)| *n > 0)
            .collect();
        assert_eq!(counted, vec![&("not_framed", 1)]);
    }
}
