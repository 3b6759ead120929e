//! Counters the emulator keeps per direction, and their snapshots.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

/// What one direction of the link has seen, since the emulator started. Bytes are IP bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DirectionStats {
    /// Packets that arrived at the link.
    pub rx_pkts: u64,
    /// Bytes that arrived at the link.
    pub rx_bytes: u64,
    /// Packets that left the link (duplicates included).
    pub fwd_pkts: u64,
    /// Bytes that left the link.
    pub fwd_bytes: u64,
    /// Packets dropped by independent random loss.
    pub drop_random: u64,
    /// Packets dropped by Gilbert-Elliott burst loss.
    pub drop_burst: u64,
    /// Packets dropped because the bottleneck queue was full.
    pub drop_queue: u64,
    /// Packets dropped for being longer than the path's MTU (not counted as loss in
    /// [`DirectionStats::emulated_drops`]: a probe for the path's size is meant to fail).
    #[serde(default)]
    pub drop_too_big: u64,
    /// Bytes of the packets the emulated link dropped (random, burst, queue and MTU).
    pub drop_bytes: u64,
    /// Extra copies sent by duplication.
    pub duplicated: u64,
    /// Packets held back so that later ones overtook them.
    pub reordered: u64,
    /// Frames the emulator itself failed to carry: dropped by the kernel before the emulator read
    /// them, too large (an offload left on), or refused on send, or no buffer left. Any non-zero
    /// value means the emulator, not the emulated link, lost packets: the measurement is invalid.
    pub emulator_faults: u64,
    /// Packets sent more than [`LATE_NS`] after the time the link model gave them: the emulator
    /// process was not scheduled in time (a busy or shared host). Such packets arrive later than
    /// the configured delay says.
    pub released_late: u64,
    /// Frames the kernel gave no receive timestamp (or an implausible one): the
    /// per-millisecond timeline placed them at the time their batch was read instead.
    #[serde(default)]
    pub unstamped: u64,
    /// Packets let through, by how long they waited in the bottleneck queue: see
    /// [`queue_delay_bucket`]. Duplicates are not counted again.
    #[serde(default)]
    pub queue_delay: [u64; QUEUE_DELAY_BUCKETS],
}

/// Buckets of [`DirectionStats::queue_delay`].
pub const QUEUE_DELAY_BUCKETS: usize = 32;

/// Below this wait a packet found no queue to speak of (a few packets' serialisation at
/// 100 Mbit/s): bucket 0.
const QUEUE_DELAY_FLOOR_NS: u64 = 64_000;

/// The histogram bucket of a queueing delay: 0 below 64 µs, then half-octaves, bucket `i`
/// holding [64 µs·√2^(i-1), 64 µs·√2^i); the last bucket (from 2.1 s) takes everything longer.
pub fn queue_delay_bucket(ns: u64) -> usize {
    if ns < QUEUE_DELAY_FLOOR_NS {
        return 0;
    }
    // floor(log2((ns / floor)²)) + 1, in integers.
    let ratio_squared = u128::from(ns) * u128::from(ns)
        / (u128::from(QUEUE_DELAY_FLOOR_NS) * u128::from(QUEUE_DELAY_FLOOR_NS));
    let half_octaves = 127 - ratio_squared.leading_zeros() as usize;
    (half_octaves + 1).min(QUEUE_DELAY_BUCKETS - 1)
}

/// The upper edge of a bucket of [`queue_delay_bucket`], nanoseconds (the last bucket's is
/// its lower edge: it is open-ended).
pub fn queue_delay_bucket_upper_ns(bucket: usize) -> u64 {
    let edge = bucket.min(QUEUE_DELAY_BUCKETS - 2) as i32;
    (QUEUE_DELAY_FLOOR_NS as f64 * std::f64::consts::SQRT_2.powi(edge)).round() as u64
}

/// How late a release may be before [`DirectionStats::released_late`] counts it: 1 ms.
pub const LATE_NS: u64 = 1_000_000;

impl DirectionStats {
    /// Packets the emulated link dropped on purpose.
    pub fn emulated_drops(&self) -> u64 {
        self.drop_random + self.drop_burst + self.drop_queue
    }

    /// The change from `earlier` to `self`.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            rx_pkts: self.rx_pkts - earlier.rx_pkts,
            rx_bytes: self.rx_bytes - earlier.rx_bytes,
            fwd_pkts: self.fwd_pkts - earlier.fwd_pkts,
            fwd_bytes: self.fwd_bytes - earlier.fwd_bytes,
            drop_random: self.drop_random - earlier.drop_random,
            drop_burst: self.drop_burst - earlier.drop_burst,
            drop_queue: self.drop_queue - earlier.drop_queue,
            drop_too_big: self.drop_too_big - earlier.drop_too_big,
            drop_bytes: self.drop_bytes - earlier.drop_bytes,
            duplicated: self.duplicated - earlier.duplicated,
            reordered: self.reordered - earlier.reordered,
            emulator_faults: self.emulator_faults - earlier.emulator_faults,
            released_late: self.released_late - earlier.released_late,
            unstamped: self.unstamped - earlier.unstamped,
            queue_delay: std::array::from_fn(|i| self.queue_delay[i] - earlier.queue_delay[i]),
        }
    }

    /// The queueing delay that a fraction `q` (0 to 1) of the packets let through did not
    /// exceed, as the upper edge of its histogram bucket (so within a factor √2 above);
    /// `None` when no packet went through.
    pub fn queue_delay_quantile(&self, q: f64) -> Option<u64> {
        let total: u64 = self.queue_delay.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        let bucket = self.queue_delay.iter().position(|&n| {
            seen += n;
            seen >= rank
        })?;
        Some(queue_delay_bucket_upper_ns(bucket))
    }
}

/// A snapshot of the whole emulator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EmulatorStats {
    /// From gw-a to gw-b (client to server).
    pub a_to_b: DirectionStats,
    /// From gw-b to gw-a (server to client).
    pub b_to_a: DirectionStats,
    /// User CPU seconds of the emulator process.
    pub cpu_user_s: f64,
    /// System CPU seconds of the emulator process.
    pub cpu_sys_s: f64,
    /// Peak resident memory of the emulator process, KiB.
    pub max_rss_kb: u64,
    /// Packet buffers allocated (the high-water mark of packets held at once).
    pub buffers: u64,
}

impl EmulatorStats {
    /// CPU seconds, user plus system.
    pub fn cpu_s(&self) -> f64 {
        self.cpu_user_s + self.cpu_sys_s
    }
}

/// Live counters of one direction. Each has a single writer (the forwarding thread), so an
/// update is a relaxed load and store, not a locked read-modify-write; readers may see a
/// snapshot a few packets old.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    values: [AtomicU64; 14],
    queue_delay: [AtomicU64; QUEUE_DELAY_BUCKETS],
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Counter {
    RxPkts,
    RxBytes,
    FwdPkts,
    FwdBytes,
    DropRandom,
    DropBurst,
    DropQueue,
    DropBytes,
    Duplicated,
    Reordered,
    EmulatorFaults,
    ReleasedLate,
    Unstamped,
    DropTooBig,
}

impl Counters {
    pub(crate) fn add(&self, counter: Counter, n: u64) {
        let slot = &self.values[counter as usize];
        slot.store(slot.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }

    pub(crate) fn add_queue_delay(&self, ns: u64) {
        let slot = &self.queue_delay[queue_delay_bucket(ns)];
        slot.store(slot.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> DirectionStats {
        let v = |c: Counter| self.values[c as usize].load(Ordering::Relaxed);
        DirectionStats {
            rx_pkts: v(Counter::RxPkts),
            rx_bytes: v(Counter::RxBytes),
            fwd_pkts: v(Counter::FwdPkts),
            fwd_bytes: v(Counter::FwdBytes),
            drop_random: v(Counter::DropRandom),
            drop_burst: v(Counter::DropBurst),
            drop_queue: v(Counter::DropQueue),
            drop_too_big: v(Counter::DropTooBig),
            drop_bytes: v(Counter::DropBytes),
            duplicated: v(Counter::Duplicated),
            reordered: v(Counter::Reordered),
            emulator_faults: v(Counter::EmulatorFaults),
            released_late: v(Counter::ReleasedLate),
            unstamped: v(Counter::Unstamped),
            queue_delay: std::array::from_fn(|i| self.queue_delay[i].load(Ordering::Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_delay_buckets_are_half_octaves_from_64_microseconds() {
        assert_eq!(queue_delay_bucket(0), 0);
        assert_eq!(queue_delay_bucket(63_999), 0);
        assert_eq!(queue_delay_bucket(64_000), 1);
        assert_eq!(queue_delay_bucket(90_000), 1);
        assert_eq!(queue_delay_bucket(90_600), 2);
        assert_eq!(queue_delay_bucket(128_000), 3);
        assert_eq!(queue_delay_bucket(u64::MAX / 4), QUEUE_DELAY_BUCKETS - 1);
        for ns in [
            64_000,
            100_000,
            1_000_000,
            37_000_000,
            100_000_000,
            2_000_000_000,
        ] {
            let b = queue_delay_bucket(ns);
            assert!(ns < queue_delay_bucket_upper_ns(b), "{ns} in bucket {b}");
            assert!(
                ns >= queue_delay_bucket_upper_ns(b - 1),
                "{ns} in bucket {b}"
            );
        }
    }

    #[test]
    fn quantiles_come_from_the_histogram_counts() {
        let mut stats = DirectionStats::default();
        assert_eq!(stats.queue_delay_quantile(0.95), None);
        // 90 packets without a queue, 10 that waited about 50 ms.
        stats.queue_delay[0] = 90;
        stats.queue_delay[queue_delay_bucket(50_000_000)] = 10;
        assert_eq!(stats.queue_delay_quantile(0.5), Some(QUEUE_DELAY_FLOOR_NS));
        assert_eq!(stats.queue_delay_quantile(0.90), Some(QUEUE_DELAY_FLOOR_NS));
        let p95 = stats.queue_delay_quantile(0.95).expect("packets");
        assert!((50_000_000..71_000_000).contains(&p95), "{p95}");
    }
}

/// Bytes arriving at one direction of the link per millisecond, from a mark the control
/// socket sets: the sending gateway's pattern as it leaves its interface, 1 ms at a time
/// (the shaping benchmark's smoothness and per-second rates). Off until marked. Like the
/// counters, it has a single writer.
#[derive(Debug)]
pub(crate) struct Timeline {
    /// The mark, monotonic ns; 0: not recording.
    start_ns: AtomicU64,
    slots: Box<[AtomicU64]>,
}

/// Milliseconds a timeline holds: ten minutes.
pub(crate) const TIMELINE_SLOTS: usize = 600_000;

impl Default for Timeline {
    fn default() -> Self {
        Self {
            start_ns: AtomicU64::new(0),
            slots: (0..TIMELINE_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Timeline {
    /// Starts afresh at `now_ns`.
    pub(crate) fn mark(&self, now_ns: u64) {
        self.start_ns.store(0, Ordering::Relaxed);
        for slot in self.slots.iter() {
            slot.store(0, Ordering::Relaxed);
        }
        self.start_ns.store(now_ns.max(1), Ordering::Relaxed);
    }

    /// `bytes` arrived at `now_ns`.
    pub(crate) fn add(&self, now_ns: u64, bytes: u64) {
        let start = self.start_ns.load(Ordering::Relaxed);
        if start == 0 || now_ns < start {
            return;
        }
        if let Some(slot) = self.slots.get(((now_ns - start) / 1_000_000) as usize) {
            slot.store(slot.load(Ordering::Relaxed) + bytes, Ordering::Relaxed);
        }
    }

    /// Bytes per millisecond since the mark, up to the last that saw any.
    pub(crate) fn read(&self) -> Vec<u64> {
        let all: Vec<u64> = self
            .slots
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .collect();
        let end = all.iter().rposition(|&b| b > 0).map_or(0, |i| i + 1);
        all[..end].to_vec()
    }
}
