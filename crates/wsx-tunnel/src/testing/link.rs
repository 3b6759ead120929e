//! A simulated one-way link: bottleneck rate with a drop-tail queue, propagation delay, random
//! and burst loss, reordering, duplication and corruption, all from a seeded generator.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

/// What a simulated link does to datagrams.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// One-way propagation delay.
    pub delay: Duration,
    /// Bottleneck rate in bytes of UDP payload per second (`None`: unlimited).
    pub rate: Option<u64>,
    /// Drop-tail queue in front of the bottleneck, bytes.
    pub queue: u64,
    /// Independent loss probability per datagram.
    pub loss: f64,
    /// Gilbert-Elliott burst loss: (P(good→bad), P(bad→good)) per datagram; every datagram
    /// in the bad state is lost.
    pub burst: Option<(f64, f64)>,
    /// Whether the line's losses (`loss`, `burst`) happen before the bottleneck instead of
    /// after it, as netem and the lab's emulator place them: the bottleneck then serializes
    /// only what survived, and a sender must send more than its rate to keep it busy.
    pub loss_before_queue: bool,
    /// Probability that a datagram is held back by `reorder_delay` (so later ones pass it).
    pub reorder: f64,
    pub reorder_delay: Duration,
    /// Probability that a datagram is delivered twice.
    pub duplicate: f64,
    /// A host on the way held off the CPU: with the probability, per datagram, the line
    /// stops for the duration as the datagram arrives, and it and all that arrive while it
    /// is stopped come out at its end, in order (`None`: never).
    pub stall: Option<(f64, Duration)>,
    /// Probability that one byte of a datagram is flipped.
    pub corrupt: f64,
    /// Datagrams longer than this are dropped: a path whose MTU is below them, with
    /// don't-fragment set (`None`: no limit). [`LinkConfig::new`] makes it an Ethernet path
    /// for the simulation's IPv6 addresses: a 1500-byte MTU, 1,452 bytes of UDP payload.
    pub max_datagram: Option<usize>,
}

/// The UDP payload a 1500-byte MTU carries over IPv6.
const ETHERNET_IPV6_DATAGRAM: usize = 1452;

impl LinkConfig {
    /// A clean link: `rtt / 2` delay, `rate_mbit` bottleneck and one BDP of queue, over
    /// Ethernet (see `max_datagram`).
    pub fn new(rtt: Duration, rate_mbit: u64) -> Self {
        let rate = rate_mbit * 1_000_000 / 8;
        Self {
            delay: rtt / 2,
            rate: Some(rate),
            queue: crate::congestion::bytes_in(rate, rtt).max(64 * 1024),
            loss: 0.0,
            burst: None,
            loss_before_queue: false,
            reorder: 0.0,
            reorder_delay: Duration::ZERO,
            duplicate: 0.0,
            stall: None,
            corrupt: 0.0,
            max_datagram: Some(ETHERNET_IPV6_DATAGRAM),
        }
    }

    pub fn with_loss(mut self, loss: f64) -> Self {
        self.loss = loss;
        self
    }
}

/// What a link did, cumulatively.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub sent: u64,
    pub sent_bytes: u64,
    pub delivered: u64,
    pub delivered_bytes: u64,
    pub dropped_queue: u64,
    pub dropped_loss: u64,
    /// Longer than the path's `max_datagram`.
    pub dropped_too_big: u64,
    pub duplicated: u64,
    pub corrupted: u64,
}

#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) config: LinkConfig,
    rng: fastrand::Rng,
    /// When the bottleneck finishes serializing what it has accepted.
    busy_until: Option<Instant>,
    bad_state: bool,
    /// Until when a stall (see [`LinkConfig::stall`]) holds arrivals.
    stalled_until: Option<Instant>,
    sequence: u64,
    /// (arrival, sequence, slot, tag): the tag says which endpoint sent (or is to receive)
    /// the datagram when several share the link.
    in_flight: BinaryHeap<Reverse<(Instant, u64, usize, usize)>>,
    /// Datagram storage; slots are reused.
    slots: Vec<Vec<u8>>,
    free: Vec<usize>,
    pub(crate) stats: LinkStats,
}

impl Link {
    pub(crate) fn new(config: LinkConfig, seed: u64) -> Self {
        Self {
            config,
            rng: fastrand::Rng::with_seed(seed),
            busy_until: None,
            bad_state: false,
            stalled_until: None,
            sequence: 0,
            in_flight: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            stats: LinkStats::default(),
        }
    }

    fn store(&mut self, data: &[u8]) -> usize {
        match self.free.pop() {
            Some(slot) => {
                self.slots[slot].clear();
                self.slots[slot].extend_from_slice(data);
                slot
            }
            None => {
                self.slots.push(data.to_vec());
                self.slots.len() - 1
            }
        }
    }

    /// A datagram enters the link at `now`, tagged with `tag` (see `in_flight`).
    pub(crate) fn send(&mut self, now: Instant, data: &[u8], tag: usize) {
        self.stats.sent += 1;
        self.stats.sent_bytes += data.len() as u64;
        let size = data.len() as u64;
        if self.config.max_datagram.is_some_and(|max| data.len() > max) {
            self.stats.dropped_too_big += 1;
            return;
        }
        if self.config.loss_before_queue && self.line_drops() {
            return;
        }
        // The bottleneck: queue, then serialize.
        let mut leave = now;
        if let Some(rate) = self.config.rate {
            let start = self.busy_until.map_or(now, |t| t.max(now));
            let backlog = crate::congestion::bytes_in(rate, start - now);
            if backlog + size > self.config.queue {
                self.stats.dropped_queue += 1;
                return;
            }
            let serialize =
                Duration::from_nanos((u128::from(size) * 1_000_000_000 / u128::from(rate)) as u64);
            leave = start + serialize;
            self.busy_until = Some(leave);
        }
        // The line beyond it: losses.
        if !self.config.loss_before_queue && self.line_drops() {
            return;
        }
        let mut arrive = leave + self.config.delay;
        // A stall starts only on a running line: one that began while stopped would let
        // what it holds out in the middle of the longer stall.
        if let Some((chance, length)) = self.config.stall
            && self.stalled_until.is_none_or(|until| arrive >= until)
            && self.chance(chance)
        {
            self.stalled_until = Some(arrive + length);
        }
        if let Some(until) = self.stalled_until {
            arrive = arrive.max(until);
        }
        if self.chance(self.config.reorder) {
            arrive += self.config.reorder_delay;
        }
        let copies = if self.chance(self.config.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let slot = self.store(data);
            if self.chance(self.config.corrupt) {
                let datagram = &mut self.slots[slot];
                let at = self.rng.usize(..datagram.len());
                datagram[at] ^= 1 << self.rng.u8(0..8);
                self.stats.corrupted += 1;
            }
            self.sequence += 1;
            self.in_flight
                .push(Reverse((arrive, self.sequence, slot, tag)));
        }
    }

    /// Whether the line loses the datagram now (bursts, then independent losses); counted.
    fn line_drops(&mut self) -> bool {
        if let Some((to_bad, to_good)) = self.config.burst {
            self.bad_state = if self.bad_state {
                !self.chance(to_good)
            } else {
                self.chance(to_bad)
            };
        }
        let lost = self.bad_state || self.chance(self.config.loss);
        self.stats.dropped_loss += u64::from(lost);
        lost
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.f64() < p
    }

    /// When the next datagram arrives.
    pub(crate) fn next_arrival(&self) -> Option<Instant> {
        self.in_flight.peek().map(|Reverse((at, ..))| *at)
    }

    /// Takes the next datagram that has arrived by `now` into `out`; returns its tag.
    pub(crate) fn receive(&mut self, now: Instant, out: &mut Vec<u8>) -> Option<usize> {
        match self.in_flight.peek() {
            Some(Reverse((at, ..))) if *at <= now => {}
            _ => return None,
        }
        let Reverse((_, _, slot, tag)) = self.in_flight.pop()?;
        out.clear();
        out.extend_from_slice(&self.slots[slot]);
        self.free.push(slot);
        self.stats.delivered += 1;
        self.stats.delivered_bytes += out.len() as u64;
        Some(tag)
    }

    /// Changes the bottleneck rate from now on.
    pub(crate) fn set_rate(&mut self, rate: u64) {
        self.config.rate = Some(rate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bottleneck_paces_and_the_queue_drops_overflow() {
        let t0 = crate::test_epoch();
        let config = LinkConfig {
            queue: 10_000,
            ..LinkConfig::new(Duration::from_millis(100), 8) // 1 MB/s
        };
        let mut link = Link::new(config, 1);
        for _ in 0..20 {
            link.send(t0, &[0; 1000], 0);
        }
        // 10 fit in the queue (the first starts serializing at once), the rest drop.
        assert_eq!(link.stats.dropped_queue, 10);
        let mut out = Vec::new();
        let mut arrivals = Vec::new();
        while let Some(now) = link.next_arrival() {
            while link.receive(now, &mut out).is_some() {
                arrivals.push(now - t0);
            }
        }
        assert_eq!(arrivals.len(), 10);
        // One millisecond per packet, after 50 ms of delay.
        assert_eq!(arrivals[0], Duration::from_millis(51));
        assert_eq!(arrivals[9], Duration::from_millis(60));
    }

    #[test]
    fn a_stall_holds_what_arrives_during_it_in_order() {
        let t0 = crate::test_epoch();
        let ms = Duration::from_millis(1);
        let config = LinkConfig {
            rate: None,
            stall: Some((1.0, 30 * ms)),
            ..LinkConfig::new(40 * ms, 1)
        };
        let mut link = Link::new(config, 1);
        // Arrives at 20 ms and stops the line until 50 ms; the stalls that would start in
        // it do not.
        link.send(t0, &[1], 0);
        link.send(t0 + 5 * ms, &[2], 0);
        link.send(t0 + 29 * ms, &[3], 0);
        link.config.stall = None;
        link.send(t0 + 31 * ms, &[4], 0);
        let mut out = Vec::new();
        let mut arrivals = Vec::new();
        while let Some(now) = link.next_arrival() {
            while link.receive(now, &mut out).is_some() {
                arrivals.push((now - t0, out[0]));
            }
        }
        let expected = [(50 * ms, 1), (50 * ms, 2), (50 * ms, 3), (51 * ms, 4)];
        assert_eq!(arrivals, expected);
    }

    #[test]
    fn loss_is_close_to_configured() {
        let t0 = crate::test_epoch();
        let mut link = Link::new(
            LinkConfig {
                rate: None,
                ..LinkConfig::new(Duration::from_millis(10), 1).with_loss(0.05)
            },
            7,
        );
        for _ in 0..20_000 {
            link.send(t0, &[1; 100], 0);
        }
        // Binomial(20000, 0.05): mean 1000, sd 31.
        assert!(
            (900..1100).contains(&link.stats.dropped_loss),
            "{:?}",
            link.stats
        );
    }
}
