//! SMB on the gateway: every session through a tunnel to TCP port 445 of a peer with `smb`
//! on is watched by `wsx-smb`'s observer as the relay copies it, and the gateway counts
//! what the observer concludes (`Gateway::smb`). Both gateways of a session watch it, each
//! counting what it relays.
//!
//! When both gateways run the read-ahead engine (each says so in the tunnel's handshake,
//! [`EXTENSION`]), the client's gateway marks the session's stream ([`HINT`]) and each runs
//! its half in the relay ([`Engine`]): near, where the client is, far where the server is.
//! Otherwise the relay copies the bytes and the observer reads them in its buffer, before
//! they are written on: no copy, no delay, nothing changed.

use crate::buffers::RelayBuffers;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::info;
use wsx_smb::engine::{EngineStats, Splice};
use wsx_smb::{Direction, Observer, ReadStats, Reason, Verdict};

/// The port SMB2/3 runs on (Direct TCP, MS-SMB2 2.1).
pub(crate) const PORT: u16 = 445;

/// This gateway's bit in the tunnel's application extensions
/// ([`wsx_tunnel::TransportConfig::app_extensions`]): it runs the read-ahead engine on a
/// stream whose hint is [`HINT`]. Bit 2, the engine's records as `wsx_smb::engine::link`
/// has them since ANNOUNCE carries a validity window and near answers EXPIRED; bit 1 was
/// the records before that, bit 0 the READ-only ones, which this gateway no longer speaks
/// (a peer offering only those gets the plain relay).
pub(crate) const EXTENSION: u32 = 1 << 2;

/// The hint of a stream that carries the engine's records
/// ([`wsx_smb::engine::link`]) instead of the session's bytes.
pub(crate) const HINT: &[u8] = b"smb";

/// How far ahead of a client far reads by default, per session: a 500 Mbit/s path of
/// 100 ms holds 6 MB.
pub const DEFAULT_READ_AHEAD: u64 = 8 << 20;

/// How long the client's gateway may hold an answer read ahead from a file other clients
/// may write (no oplock granting read caching, a share mode that lets others write), ms:
/// what the client gets is then at most this much older than what the server would have
/// given it, plus the time the answer took to cross. Samba's own clients and most
/// scripted ones open files so.
pub const DEFAULT_VALIDITY_MS: u32 = 1000;

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
    engine_sessions: AtomicU64,
    prefetched: AtomicU64,
    prefetched_bytes: AtomicU64,
    answered_locally: AtomicU64,
    missed: AtomicU64,
    missed_bytes: AtomicU64,
    expired: AtomicU64,
    resumed: AtomicU64,
    held_bytes: AtomicU64,
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
    /// Sessions this gateway ran its half of the read-ahead engine on (the peer ran the
    /// other): far's on sessions its peer's clients opened, near's on its own clients'.
    pub engine_sessions: u64,
    /// Requests far issued ahead of its clients (READs and QUERY_INFOs), and the bytes
    /// the READs asked for.
    pub prefetched: u64,
    pub prefetched_bytes: u64,
    /// Client requests near answered itself, each a round trip saved: READs and
    /// QUERY_INFOs from what far had sent ahead, and CLOSEs.
    pub answered_locally: u64,
    /// Predictions far's clients did not use, and their bytes: read for nothing.
    pub missed: u64,
    pub missed_bytes: u64,
    /// Answers near (this gateway, for its own clients) held past their validity window
    /// before the client asked (a file others may write): the client's READ went to the
    /// server after all, and far, on the other gateway, counted a miss. Many of them mean
    /// a reader slower than the window allows for, or a path too slow for it
    /// (`smb_validity_ms`).
    pub expired: u64,
    /// Files far started reading ahead again after a miss had stopped it, the client
    /// reading on in sequence.
    pub resumed: u64,
    /// Bytes the engine holds now, all sessions together (frames being read, answers
    /// waiting for their READ, bytes waiting to be written).
    pub held_bytes: u64,
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
            engine_sessions: self.engine_sessions.load(Ordering::Relaxed),
            prefetched: self.prefetched.load(Ordering::Relaxed),
            prefetched_bytes: self.prefetched_bytes.load(Ordering::Relaxed),
            answered_locally: self.answered_locally.load(Ordering::Relaxed),
            missed: self.missed.load(Ordering::Relaxed),
            missed_bytes: self.missed_bytes.load(Ordering::Relaxed),
            expired: self.expired.load(Ordering::Relaxed),
            resumed: self.resumed.load(Ordering::Relaxed),
            held_bytes: self.held_bytes.load(Ordering::Relaxed),
        }
    }
}

/// One session's half of the read-ahead engine, and what it adds to the gateway's totals.
///
/// Far's read-ahead is bounded gateway-wide: the bytes it has predicted and not seen
/// consumed (which wait at near, or on their way) are taken from the relay buffers'
/// budget ([`RelayBuffers::take_bytes`], at most half of it for read-ahead) while it has
/// them. Before far is handed bytes the session asks for up to its window
/// ([`Engine::lease`]); after the step, it keeps what is outstanding and gives the rest
/// back ([`Engine::count`]). With the budget spent, a session reads
/// ahead less or not at all, and its traffic flows as without read-ahead (fail open).
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) splice: Splice,
    /// The session's TCP end is its client (near) or its server (far).
    pub(crate) end_is_client: bool,
    totals: Arc<SmbTotals>,
    counted: EngineStats,
    counted_held: u64,
    /// Far: its window as configured, the budget it leases from and what it holds of it.
    window: u64,
    budget: Option<Arc<RelayBuffers>>,
    leased: u64,
}

impl Engine {
    /// Near: this gateway's client, a peer that runs far.
    pub(crate) fn near(totals: Arc<SmbTotals>) -> Self {
        Self::new(Splice::near(), true, totals)
    }

    /// Far: this gateway's server, reading ahead up to `window` bytes per session (0: the
    /// engine's framing only, no read-ahead), leased from `budget`.
    pub(crate) fn far(window: u64, totals: Arc<SmbTotals>, budget: Arc<RelayBuffers>) -> Self {
        let mut engine = Self::new(Splice::far(0), false, totals);
        engine.window = window;
        engine.budget = Some(budget);
        engine
    }

    fn new(splice: Splice, end_is_client: bool, totals: Arc<SmbTotals>) -> Self {
        totals.engine_sessions.fetch_add(1, Ordering::Relaxed);
        Self {
            splice,
            end_is_client,
            totals,
            counted: EngineStats::default(),
            counted_held: 0,
            window: 0,
            budget: None,
            leased: 0,
        }
    }

    /// Far, before it is handed bytes, if it may act ahead of the client: leases up to its
    /// window from the budget and lets far use it (what the larger window lets it issue
    /// goes out with what the bytes bring).
    pub(crate) fn lease(&mut self) {
        let Some(budget) = &self.budget else {
            return;
        };
        if self.leased >= self.window || !self.splice.may_act() {
            return;
        }
        let want = usize::try_from(self.window - self.leased).unwrap_or(usize::MAX);
        let granted = budget.take_bytes(want) as u64;
        if granted > 0 {
            self.leased += granted;
            self.splice.set_window(self.leased);
        }
    }

    /// Far, after a step: keeps of its lease what it has read ahead and not seen
    /// consumed, and gives the rest back.
    fn settle(&mut self) {
        let Some(budget) = &self.budget else {
            return;
        };
        let keep = self.splice.ahead_bytes().min(self.leased);
        if keep < self.leased {
            budget.give_bytes(usize::try_from(self.leased - keep).unwrap_or(usize::MAX));
            self.leased = keep;
            self.splice.set_window(keep);
        }
    }

    /// Adds what the engine did since the last call to the totals.
    pub(crate) fn count(&mut self) {
        let now = self.splice.stats();
        if now != self.counted {
            let old = std::mem::replace(&mut self.counted, now);
            let t = &self.totals;
            for (counter, now, before) in [
                (&t.prefetched, now.prefetched, old.prefetched),
                (
                    &t.prefetched_bytes,
                    now.prefetched_bytes,
                    old.prefetched_bytes,
                ),
                (
                    &t.answered_locally,
                    now.answered_locally,
                    old.answered_locally,
                ),
                (&t.missed, now.missed, old.missed),
                (&t.missed_bytes, now.missed_bytes, old.missed_bytes),
                (&t.expired, now.expired, old.expired),
                (&t.resumed, now.resumed, old.resumed),
            ] {
                counter.fetch_add(now.saturating_sub(before), Ordering::Relaxed);
            }
        }
        let held = self.splice.held() as u64;
        self.set_held(held);
        self.settle();
    }

    fn set_held(&mut self, held: u64) {
        if held > self.counted_held {
            let more = held - self.counted_held;
            self.totals.held_bytes.fetch_add(more, Ordering::Relaxed);
        } else {
            let less = self.counted_held - held;
            self.totals.held_bytes.fetch_sub(less, Ordering::Relaxed);
        }
        self.counted_held = held;
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.set_held(0);
        if let Some(budget) = &self.budget {
            budget.give_bytes(usize::try_from(self.leased).unwrap_or(usize::MAX));
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
mod scale_tests;

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
