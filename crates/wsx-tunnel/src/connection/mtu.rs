//! Path MTU discovery for the sending direction: datagram packetization-layer PMTUD (RFC 8899)
//! with the tunnel's own padded packets.
//!
//! Every connection starts at [`BASE_DATAGRAM`], which any path is taken to carry, and
//! searches upward with *probes*: a PING padded to the size being tried, sent beside the data
//! (never carrying any, so a lost probe costs no retransmission, and never judged as
//! congestion). An acknowledged probe raises the size every packet is built to at once.
//! Probes leave as soon as they are due, outside the congestion window and the pacer (RFC
//! 8899 would count them in the window): a round is at most three datagrams, a search a
//! few rounds per connection and per ten minutes, which no window would notice, while a
//! fresh connection's first window is better spent on data.
//!
//! The search first tries, together, the sizes the usual links give: 1500- and 9000-byte MTUs
//! less the IP and UDP headers of the peer's address family, and the cap
//! (`max_datagram`, as both sides allow). A size is taken not to fit after [`MAX_PROBES`]
//! lost probes (a single loss may be the line's), and every larger one with it. When the
//! largest size that fits is not one of the usual ones, a binary search between it and the
//! smallest that does not narrows the gap to [`GRANULARITY`].
//!
//! The path may shrink under a live connection (a route change, a tunnel added on the way):
//! loss recovery notices full-size packets vanishing while small ones get through (a *black
//! hole*) and calls [`PathMtu::on_black_hole`], which falls back to the base size and
//! searches again from there (the size that stopped working is tried like any other, so a
//! false alarm costs a round trip or two). A search that completed is repeated after
//! [`RAISE_AFTER`], in case the path grew.

use std::time::{Duration, Instant};

/// The datagram size every path is taken to carry (RFC 8899 BASE_PLPMTU for QUIC-like
/// transports, RFC 9000 §14): the handshake is padded to it, and it is the smallest
/// `max_datagram` a peer may declare.
pub(crate) const BASE_DATAGRAM: u16 = 1200;
/// Lost probes of one size after which it is taken not to fit (RFC 8899 MAX_PROBES).
const MAX_PROBES: u8 = 3;
/// The binary search stops when the sizes known to fit and not to fit are this close.
const GRANULARITY: u16 = 16;
/// How long a completed search holds before the path is tried for a larger size again
/// (RFC 8899 PMTU_RAISE_TIMER).
pub(crate) const RAISE_AFTER: Duration = Duration::from_secs(600);
/// Link MTUs most paths have: Ethernet and jumbo frames.
const COMMON_MTUS: [u16; 2] = [1500, 9000];

/// Where the search is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Trying the usual sizes (and the cap) together.
    Common,
    /// Halving the gap between what fits and what does not.
    Binary,
    /// Nothing left to try until `RAISE_AFTER` has passed.
    Complete { since: Instant },
}

/// A size being tried: how many of its probes are in flight and how many were lost.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    size: u16,
    in_flight: u8,
    lost: u8,
    /// A probe of it is to be sent.
    due: bool,
}

impl Candidate {
    fn new(size: u16) -> Self {
        Self {
            size,
            in_flight: 0,
            lost: 0,
            due: true,
        }
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct PathMtu {
    /// The size every packet but a probe is built to: the largest size acknowledged.
    current: u16,
    /// The largest size either side allows.
    cap: u16,
    /// The smallest size known not to fit (`cap + 1` while none is).
    too_big: u16,
    /// IP and UDP header bytes of the peer's address family.
    overhead: u16,
    phase: Phase,
    /// Sizes being tried, ascending; at most a handful.
    candidates: Vec<Candidate>,
    /// The sending side is established: probes may leave.
    started: bool,
    /// `current` changed since the connection last looked.
    changed: bool,
    stats: MtuStats,
}

/// Counters of the search, for the connection's statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MtuStats {
    /// Probes sent, and how many of them were acknowledged.
    pub probes_sent: u64,
    pub probes_acked: u64,
    /// Times full-size packets stopped getting through and the size fell back to the base.
    pub black_holes: u64,
}

impl PathMtu {
    /// A search for a peer reached over IPv6 or not (`ipv6`); `cap` is the largest size this
    /// side allows until the peer's parameters say what it allows.
    pub(crate) fn new(cap: u16, ipv6: bool) -> Self {
        let cap = cap.max(BASE_DATAGRAM);
        Self {
            current: BASE_DATAGRAM,
            cap,
            too_big: cap.saturating_add(1),
            overhead: if ipv6 { 48 } else { 28 },
            phase: Phase::Common,
            candidates: Vec::new(),
            started: false,
            changed: false,
            stats: MtuStats::default(),
        }
    }

    /// The datagram size packets are built to now.
    pub(crate) fn current(&self) -> u16 {
        self.current
    }

    /// Whether a probe waits to be sent (the raise timer aside, which `probe_due` checks).
    pub(crate) fn wants_probe(&self) -> bool {
        self.started && self.candidates.iter().any(|c| c.due)
    }

    pub(crate) fn stats(&self) -> MtuStats {
        self.stats
    }

    /// The largest size both sides allow is known: the search may aim at it.
    pub(crate) fn set_cap(&mut self, cap: u16) {
        self.cap = cap.max(BASE_DATAGRAM);
        self.too_big = self.too_big.min(self.cap.saturating_add(1));
        self.current = self.current.min(self.cap);
        self.candidates.retain(|c| c.size <= cap);
        let untried = !self.candidates.iter().any(|c| c.size == self.cap);
        if self.started && untried && self.cap > self.current && self.cap < self.too_big {
            let at = self.candidates.partition_point(|c| c.size < self.cap);
            self.candidates.insert(at, Candidate::new(self.cap));
        }
    }

    /// The connection is established: the search begins.
    pub(crate) fn start(&mut self, now: Instant) {
        if !self.started {
            self.started = true;
            self.begin(Phase::Common, now);
        }
    }

    /// Whether the size changed since the last call.
    pub(crate) fn take_change(&mut self) -> Option<u16> {
        std::mem::take(&mut self.changed).then_some(self.current)
    }

    /// The size of the probe to send now, if one is due.
    pub(crate) fn probe_due(&mut self, now: Instant) -> Option<u16> {
        if !self.started {
            return None;
        }
        if let Phase::Complete { since } = self.phase {
            if now < since + RAISE_AFTER || self.current >= self.cap {
                return None;
            }
            // Try again for more, from scratch above what fits now.
            self.too_big = self.cap.saturating_add(1);
            self.begin(Phase::Common, now);
        }
        self.candidates.iter().find(|c| c.due).map(|c| c.size)
    }

    /// A probe of `size` left.
    pub(crate) fn on_probe_sent(&mut self, size: u16) {
        if let Some(c) = self.candidate(size) {
            c.due = false;
            c.in_flight += 1;
            self.stats.probes_sent += 1;
        }
    }

    /// A probe of `size` was acknowledged: the path carries it.
    pub(crate) fn on_probe_acked(&mut self, now: Instant, size: u16) {
        self.stats.probes_acked += 1;
        if let Some(c) = self.candidate(size) {
            c.in_flight = c.in_flight.saturating_sub(1);
        }
        if size > self.current && size < self.too_big {
            self.current = size;
            self.changed = true;
        }
        // Everything up to it is settled.
        self.candidates.retain(|c| c.size > size);
        self.advance(now);
    }

    /// A probe of `size` was declared lost (or the kernel refused it: larger than the
    /// interface's MTU).
    pub(crate) fn on_probe_lost(&mut self, now: Instant, size: u16) {
        let Some(c) = self.candidate(size) else {
            return;
        };
        c.in_flight = c.in_flight.saturating_sub(1);
        c.lost += 1;
        if c.lost >= MAX_PROBES {
            self.too_big = self.too_big.min(size);
            self.candidates.retain(|c| c.size < size);
        } else if c.in_flight == 0 {
            c.due = true;
        }
        self.advance(now);
    }

    /// Full-size packets stopped getting through: fall back to the base size and search
    /// again from there. The size that failed is tried again like any other (its probes
    /// fail if the path did shrink; a false alarm costs a round trip or two).
    pub(crate) fn on_black_hole(&mut self, now: Instant) {
        self.stats.black_holes += 1;
        self.too_big = self.cap.saturating_add(1);
        if self.current != BASE_DATAGRAM {
            self.current = BASE_DATAGRAM;
            self.changed = true;
        }
        if self.started {
            self.begin(Phase::Common, now);
        }
    }

    fn is_common(&self, size: u16) -> bool {
        COMMON_MTUS.iter().any(|mtu| mtu - self.overhead == size)
    }

    fn candidate(&mut self, size: u16) -> Option<&mut Candidate> {
        self.candidates.iter_mut().find(|c| c.size == size)
    }

    /// Starts `phase` with its candidates (none left: the search is complete).
    fn begin(&mut self, phase: Phase, now: Instant) {
        self.phase = phase;
        self.candidates.clear();
        let (low, high) = (self.current, self.too_big);
        match phase {
            Phase::Common => {
                let mut sizes: Vec<u16> = COMMON_MTUS
                    .iter()
                    .map(|mtu| mtu - self.overhead)
                    .chain([self.cap])
                    .filter(|&s| s > low && s < high)
                    .collect();
                sizes.sort_unstable();
                sizes.dedup();
                self.candidates
                    .extend(sizes.into_iter().map(|size| Candidate {
                        size,
                        in_flight: 0,
                        lost: 0,
                        due: true,
                    }));
            }
            Phase::Binary => {
                if high - low > GRANULARITY {
                    self.candidates.push(Candidate::new(low + (high - low) / 2));
                }
            }
            Phase::Complete { .. } => {}
        }
        if self.candidates.is_empty() && !matches!(phase, Phase::Complete { .. }) {
            self.finish(phase, now);
        }
    }

    /// Moves on once every size of the phase is resolved.
    fn advance(&mut self, now: Instant) {
        if self.candidates.is_empty() && !matches!(self.phase, Phase::Complete { .. }) {
            self.finish(self.phase, now);
        }
    }

    fn finish(&mut self, phase: Phase, now: Instant) {
        let next = match phase {
            // The usual sizes settled it: the path ends at one of them, or at the cap.
            Phase::Common if self.is_common(self.current) || self.current >= self.cap => None,
            Phase::Common | Phase::Binary => {
                (self.too_big - self.current > GRANULARITY).then_some(Phase::Binary)
            }
            Phase::Complete { .. } => None,
        };
        match next {
            Some(phase) => self.begin(phase, now),
            None => self.phase = Phase::Complete { since: now },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Runs the search against a path that carries datagrams up to `path` bytes, one round
    /// trip per round (every probe due is sent, then each is answered); `drop(n)` loses the
    /// n-th probe whatever its size. Returns the rounds it took to complete.
    fn search(
        mtu: &mut PathMtu,
        now: &mut Instant,
        path: u16,
        mut drop: impl FnMut(u64) -> bool,
    ) -> u32 {
        let mut sent = 0u64;
        for round in 1..=200 {
            let mut probes = Vec::new();
            while let Some(size) = mtu.probe_due(*now) {
                mtu.on_probe_sent(size);
                probes.push(size);
            }
            if probes.is_empty() {
                return round;
            }
            *now += Duration::from_millis(100);
            for size in probes {
                sent += 1;
                if size <= path && !drop(sent) {
                    mtu.on_probe_acked(*now, size);
                } else {
                    mtu.on_probe_lost(*now, size);
                }
                assert!(
                    mtu.current() <= path,
                    "{} above the path's {path}",
                    mtu.current()
                );
            }
        }
        panic!("the search never completed");
    }

    fn started(cap: u16, ipv6: bool, now: Instant) -> PathMtu {
        let mut mtu = PathMtu::new(cap, ipv6);
        mtu.start(now);
        mtu
    }

    #[test]
    fn an_ethernet_path_ends_at_its_exact_size_in_a_few_round_trips() {
        let mut now = crate::test_epoch();
        for (ipv6, expected) in [(false, 1472), (true, 1452)] {
            let mut mtu = started(9000, ipv6, now);
            assert_eq!(mtu.current(), BASE_DATAGRAM);
            let rounds = search(&mut mtu, &mut now, expected, |_| false);
            assert_eq!(mtu.current(), expected);
            assert_eq!(mtu.take_change(), Some(expected));
            // The first round finds it; the jumbo sizes take MAX_PROBES rounds to give up.
            assert!(rounds <= 1 + u32::from(MAX_PROBES), "{rounds} rounds");
            // Nothing more is tried until the raise timer.
            assert_eq!(mtu.probe_due(now), None);
        }
    }

    #[test]
    fn a_jumbo_path_reaches_the_cap_or_its_size() {
        let mut now = crate::test_epoch();
        let mut mtu = started(9000, false, now);
        search(&mut mtu, &mut now, 9000, |_| false);
        assert_eq!(mtu.current(), 9000);
        let mut mtu = started(9000, true, now);
        search(&mut mtu, &mut now, 8952, |_| false);
        assert_eq!(mtu.current(), 8952);
        // The peer allows less than we do.
        let mut mtu = started(9000, false, now);
        mtu.set_cap(1400);
        search(&mut mtu, &mut now, 8972, |_| false);
        assert_eq!(mtu.current(), 1400);
    }

    #[test]
    fn an_odd_path_is_found_within_the_granularity() {
        let mut now = crate::test_epoch();
        // A WireGuard-like 1420-byte MTU, IPv4: 1392 bytes of UDP payload.
        let mut mtu = started(9000, false, now);
        search(&mut mtu, &mut now, 1392, |_| false);
        assert!(
            (1392 - GRANULARITY..=1392).contains(&mtu.current()),
            "{}",
            mtu.current()
        );
    }

    #[test]
    fn a_lost_probe_is_tried_again_before_the_size_is_given_up() {
        let mut now = crate::test_epoch();
        let mut mtu = started(9000, false, now);
        // Each round sends 1472, 8972 and 9000 in that order: the first two probes of 1472
        // are lost on the line.
        search(&mut mtu, &mut now, 1472, |n| n == 1 || n == 4);
        assert_eq!(mtu.current(), 1472);
    }

    #[test]
    fn a_black_hole_falls_back_and_finds_the_smaller_path() {
        let mut now = crate::test_epoch();
        let mut mtu = started(9000, false, now);
        search(&mut mtu, &mut now, 1472, |_| false);
        assert_eq!(mtu.take_change(), Some(1472));
        // The path shrinks to a 1400-byte MTU.
        mtu.on_black_hole(now);
        assert_eq!(mtu.take_change(), Some(BASE_DATAGRAM));
        search(&mut mtu, &mut now, 1372, |_| false);
        assert!(
            (1372 - GRANULARITY..=1372).contains(&mtu.current()),
            "{}",
            mtu.current()
        );
        assert_eq!(mtu.stats().black_holes, 1);
    }

    #[test]
    fn a_completed_search_tries_for_more_after_the_raise_timer() {
        let mut now = crate::test_epoch();
        let mut mtu = started(9000, false, now);
        search(&mut mtu, &mut now, 1472, |_| false);
        now += RAISE_AFTER;
        // The path now carries jumbo frames.
        search(&mut mtu, &mut now, 8972, |_| false);
        assert_eq!(mtu.current(), 8972);
    }

    #[test]
    fn nothing_is_probed_before_the_start_or_above_a_base_cap() {
        let now = crate::test_epoch();
        let mut mtu = PathMtu::new(9000, false);
        assert_eq!(mtu.probe_due(now), None);
        let mut mtu = started(BASE_DATAGRAM, false, now);
        assert_eq!(mtu.probe_due(now), None);
        assert_eq!(mtu.current(), BASE_DATAGRAM);
    }

    proptest! {
        /// Whatever the path and the cap, the search ends at most at both, within the
        /// granularity of the smaller or at a usual size below it (random loss may leave it
        /// lower, never higher), and in a bounded number of round trips.
        #[test]
        fn the_search_never_exceeds_the_path_and_ends_near_it(
            path in 1200u16..=9216,
            cap in 1200u16..=9216,
            ipv6 in any::<bool>(),
            loss_seed in any::<u64>(),
            lossy in any::<bool>(),
        ) {
            let mut now = crate::test_epoch();
            let mut mtu = started(cap, ipv6, now);
            let mut state = loss_seed | 1;
            let drop = |_: u64| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                lossy && state % 20 == 0
            };
            let rounds = search(&mut mtu, &mut now, path, drop);
            let target = path.min(cap);
            prop_assert!(mtu.current() <= target);
            if !lossy {
                let near = mtu.current() + GRANULARITY >= target;
                prop_assert!(near || mtu.is_common(mtu.current()), "{} for {target}", mtu.current());
            }
            prop_assert!(rounds <= 60, "{rounds} rounds");
        }
    }
}
