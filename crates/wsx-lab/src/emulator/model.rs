//! The link model: a pure state machine that decides, for each packet entering one direction of
//! the link, whether it is dropped and when it leaves. It never reads the clock: the bridge passes
//! `now` in, which is what makes the model's unit and property tests exact.
//!
//! The order of operations per packet is that of a lossy line behind a router:
//! 0. a packet longer than the path's MTU is dropped (a black hole: no ICMP error);
//! 1. loss (Gilbert-Elliott state step, then independent loss): the packet never reaches the queue;
//! 2. the drop-tail queue in front of the bottleneck: dropped if it does not fit;
//! 3. serialisation at the bottleneck rate, behind the packets already queued;
//! 4. propagation delay plus jitter, clamped so packets keep their order unless reordered;
//! 5. duplication.

use super::params::LinkParams;

/// What happens to one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The packet is dropped.
    Drop(DropReason),
    /// The packet leaves the link at `at_ns`, once or, when duplicated, twice.
    Deliver {
        /// Departure time, nanoseconds on the caller's clock.
        at_ns: u64,
        /// The packet is delivered a second time at the same instant.
        duplicate: bool,
        /// The packet was held back so that later packets overtake it.
        reordered: bool,
        /// How long it waited in the bottleneck queue before its own serialisation began.
        queued_ns: u64,
    },
}

/// Why a packet was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// Independent random loss.
    Random,
    /// Gilbert-Elliott burst loss.
    Burst,
    /// The bottleneck queue was full.
    Queue,
    /// Longer than the path's MTU.
    TooBig,
}

/// A probability as a threshold on a uniformly random `u64`, so a decision costs one comparison.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Chance(u64);

impl Chance {
    fn percent(pct: f64) -> Self {
        let p = (pct / 100.0).clamp(0.0, 1.0);
        // 2^64 * p, saturating at "always".
        Chance(if p >= 1.0 {
            u64::MAX
        } else {
            (p * 18_446_744_073_709_551_616.0) as u64
        })
    }

    fn hit(self, rng: &mut fastrand::Rng) -> bool {
        self.0 != 0 && (self.0 == u64::MAX || rng.u64(..) < self.0)
    }
}

/// One direction of the emulated link.
#[derive(Debug)]
pub struct Link {
    params: LinkParams,
    loss: Chance,
    burst: Option<[Chance; 4]>, // p (G→B), r (B→G), loss in Good, loss in Bad
    reorder: Chance,
    duplicate: Chance,
    queue_limit_bytes: u64,
    rng: fastrand::Rng,
    in_bad_state: bool,
    /// When the bottleneck finishes serialising everything accepted so far.
    busy_until_ns: u64,
    /// Departure time of the last in-order packet; later packets never leave before it.
    last_departure_ns: u64,
}

impl Link {
    /// A link with these parameters and a seeded random generator: the same seed and the same
    /// packet arrivals give the same verdicts.
    pub fn new(params: LinkParams, seed: u64) -> Self {
        let mut link = Link {
            params: LinkParams::default(),
            loss: Chance::default(),
            burst: None,
            reorder: Chance::default(),
            duplicate: Chance::default(),
            queue_limit_bytes: 0,
            rng: fastrand::Rng::with_seed(seed),
            in_bad_state: false,
            busy_until_ns: 0,
            last_departure_ns: 0,
        };
        link.set_params(params);
        link
    }

    /// The parameters in force.
    pub fn params(&self) -> &LinkParams {
        &self.params
    }

    /// Changes the link while it runs. Packets already accepted keep their departure times; the
    /// new rate, delay and loss apply to packets arriving from now on.
    pub fn set_params(&mut self, params: LinkParams) {
        self.loss = Chance::percent(params.loss_pct);
        self.burst = params.burst.as_ref().map(|ge| {
            [
                Chance::percent(ge.p_pct),
                Chance::percent(ge.r_pct),
                Chance::percent(ge.loss_good_pct),
                Chance::percent(ge.loss_bad_pct),
            ]
        });
        self.reorder = Chance::percent(params.reorder_pct);
        self.duplicate = Chance::percent(params.duplicate_pct);
        self.queue_limit_bytes = params.queue.bytes(params.rate_kbit);
        self.params = params;
    }

    /// Bytes waiting for (or in) serialisation at `now_ns`.
    pub fn backlog_bytes(&self, now_ns: u64) -> u64 {
        let waiting_ns = self.busy_until_ns.saturating_sub(now_ns);
        // bits = ns * kbit/s / 1e6; bytes = bits / 8
        (u128::from(waiting_ns) * u128::from(self.params.rate_kbit) / 8_000_000) as u64
    }

    /// Decides the fate of a packet of `ip_bytes` arriving at `now_ns`.
    pub fn handle_packet(&mut self, now_ns: u64, ip_bytes: u64) -> Verdict {
        if self.params.mtu > 0 && ip_bytes > self.params.mtu {
            return Verdict::Drop(DropReason::TooBig);
        }
        if let Some([p, r, loss_good, loss_bad]) = self.burst {
            // Step the chain, then draw the loss of the state the packet finds.
            let flip = if self.in_bad_state { r } else { p };
            if flip.hit(&mut self.rng) {
                self.in_bad_state = !self.in_bad_state;
            }
            let loss = if self.in_bad_state {
                loss_bad
            } else {
                loss_good
            };
            if loss.hit(&mut self.rng) {
                return Verdict::Drop(DropReason::Burst);
            }
        }
        if self.loss.hit(&mut self.rng) {
            return Verdict::Drop(DropReason::Random);
        }

        let mut departure = now_ns;
        let mut queued_ns = 0;
        let rate = self.params.rate_kbit;
        if rate > 0 {
            if self.backlog_bytes(now_ns) + ip_bytes > self.queue_limit_bytes {
                return Verdict::Drop(DropReason::Queue);
            }
            // ns = bits * 1e6 / kbit/s, rounded up so the rate is never exceeded.
            let serialise_ns = (u128::from(ip_bytes) * 8_000_000).div_ceil(u128::from(rate)) as u64;
            queued_ns = self.busy_until_ns.saturating_sub(now_ns);
            self.busy_until_ns = self.busy_until_ns.max(now_ns) + serialise_ns;
            departure = self.busy_until_ns;
        }

        departure += self.params.delay_us * 1000;
        let jitter_ns = self.params.jitter_us * 1000;
        if jitter_ns > 0 {
            let offset = self.rng.u64(..=2 * jitter_ns);
            departure = (departure + offset).saturating_sub(jitter_ns).max(now_ns);
        }

        let reordered = self.reorder.hit(&mut self.rng);
        if reordered {
            departure += self.params.reorder_delay_us * 1000;
        } else {
            departure = departure.max(self.last_departure_ns);
            self.last_departure_ns = departure;
        }
        let duplicate = self.duplicate.hit(&mut self.rng);
        Verdict::Deliver {
            at_ns: departure,
            duplicate,
            reordered,
            queued_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emulator::params::{GilbertElliott, QueueLimit};
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn packets_longer_than_the_mtu_are_dropped_and_the_rest_pass() {
        let mut link = Link::new(
            LinkParams {
                mtu: 1350,
                ..LinkParams::with_delay_ms(10.0)
            },
            1,
        );
        assert_eq!(
            link.handle_packet(0, 1351),
            Verdict::Drop(DropReason::TooBig)
        );
        assert_eq!(deliver_at(link.handle_packet(0, 1350)), 10 * MS);
        link.set_params(LinkParams::with_delay_ms(10.0));
        assert_eq!(deliver_at(link.handle_packet(0, 1500)), 10 * MS);
    }

    fn deliver_at(v: Verdict) -> u64 {
        match v {
            Verdict::Deliver { at_ns, .. } => at_ns,
            Verdict::Drop(r) => panic!("dropped: {r:?}"),
        }
    }

    #[test]
    fn delay_only_adds_exactly_the_delay() {
        let mut link = Link::new(LinkParams::with_delay_ms(50.0), 1);
        for t in [0, 3 * MS, 7 * MS] {
            assert_eq!(deliver_at(link.handle_packet(t, 1500)), t + 50 * MS);
        }
    }

    /// 12 Mbit/s, where a 1500-byte packet takes exactly 1 ms, with room for 666 of them.
    fn twelve_megabit_link() -> Link {
        let params = LinkParams {
            rate_kbit: 12_000,
            queue: QueueLimit::Bytes(1_000_000),
            ..Default::default()
        };
        Link::new(params, 1)
    }

    #[test]
    fn bottleneck_serialises_back_to_back_packets_at_the_rate() {
        let mut link = twelve_megabit_link();
        let departures: Vec<u64> = (0..10)
            .map(|_| deliver_at(link.handle_packet(0, 1500)))
            .collect();
        assert_eq!(departures, (1..=10).map(|i| i * MS).collect::<Vec<_>>());
        // After the queue drains, a packet is serialised from its own arrival.
        assert_eq!(deliver_at(link.handle_packet(20 * MS, 1500)), 21 * MS);
    }

    #[test]
    fn a_packet_reports_the_wait_for_those_queued_ahead_of_it() {
        let mut link = twelve_megabit_link();
        let queued = |v: Verdict| match v {
            Verdict::Deliver { queued_ns, .. } => queued_ns,
            Verdict::Drop(r) => panic!("dropped: {r:?}"),
        };
        let waits: Vec<u64> = (0..4)
            .map(|_| queued(link.handle_packet(0, 1500)))
            .collect();
        assert_eq!(waits, [0, MS, 2 * MS, 3 * MS]);
        assert_eq!(queued(link.handle_packet(MS * 5 / 2, 1500)), MS * 3 / 2);
        assert_eq!(queued(link.handle_packet(10 * MS, 1500)), 0);
    }

    #[test]
    fn queue_drops_exactly_beyond_its_depth() {
        let params = LinkParams {
            rate_kbit: 10_000,
            queue: QueueLimit::Bytes(30_000),
            ..Default::default()
        };
        let mut link = Link::new(params, 1);
        let verdicts: Vec<Verdict> = (0..100).map(|_| link.handle_packet(0, 1500)).collect();
        let accepted = verdicts
            .iter()
            .filter(|v| matches!(v, Verdict::Deliver { .. }))
            .count();
        assert_eq!(accepted, 20);
        assert!(
            verdicts[20..]
                .iter()
                .all(|v| *v == Verdict::Drop(DropReason::Queue))
        );
        // The queue drains at the rate: 1.2 ms later one more packet fits.
        assert!(matches!(
            link.handle_packet(1_200_000, 1500),
            Verdict::Deliver { .. }
        ));
        assert_eq!(
            link.handle_packet(1_200_000, 1500),
            Verdict::Drop(DropReason::Queue)
        );
    }

    #[test]
    fn queue_in_milliseconds_scales_with_the_rate() {
        assert_eq!(QueueLimit::Ms(10.0).bytes(100_000), 125_000);
        assert_eq!(QueueLimit::Bytes(4242).bytes(100_000), 4242);
    }

    #[test]
    fn random_loss_rate_is_within_the_binomial_interval() {
        let mut link = Link::new(
            LinkParams {
                loss_pct: 1.0,
                ..Default::default()
            },
            7,
        );
        let n = 1_000_000u64;
        let lost = (0..n)
            .filter(|i| matches!(link.handle_packet(*i, 100), Verdict::Drop(_)))
            .count() as f64;
        // mean 10,000, sd 99.5; 99.9 % two-sided interval is ±3.29 sd.
        assert!((lost - 10_000.0).abs() < 3.29 * 99.5, "lost {lost}");
    }

    #[test]
    fn gilbert_elliott_loses_in_bursts_of_the_configured_mean_length() {
        let ge = GilbertElliott {
            p_pct: 1.0,
            r_pct: 25.0,
            loss_good_pct: 0.0,
            loss_bad_pct: 100.0,
        };
        let mut link = Link::new(
            LinkParams {
                burst: Some(ge),
                ..Default::default()
            },
            11,
        );
        let (mut bursts, mut lost, mut in_burst) = (0u64, 0u64, false);
        for i in 0..1_000_000 {
            let dropped = link.handle_packet(i, 100) == Verdict::Drop(DropReason::Burst);
            lost += u64::from(dropped);
            bursts += u64::from(dropped && !in_burst);
            in_burst = dropped;
        }
        let mean_burst = lost as f64 / bursts as f64;
        // Mean sojourn in Bad is 1/r = 4 packets; stationary loss p/(p+r) = 1/26.
        assert!((mean_burst - 4.0).abs() < 0.2, "mean burst {mean_burst}");
        assert!(
            (lost as f64 / 1e6 - 1.0 / 26.0).abs() < 0.003,
            "loss {lost}"
        );
    }

    #[test]
    fn rate_change_applies_to_later_packets() {
        let params = LinkParams {
            rate_kbit: 12_000,
            queue: QueueLimit::Bytes(1_000_000),
            ..Default::default()
        };
        let mut link = Link::new(params.clone(), 1);
        assert_eq!(deliver_at(link.handle_packet(0, 1500)), MS);
        link.set_params(LinkParams {
            rate_kbit: 24_000,
            ..params
        });
        assert_eq!(deliver_at(link.handle_packet(0, 1500)), MS + MS / 2);
    }

    proptest! {
        /// Without reordering, jitter never reorders and departures never precede arrivals plus
        /// the minimum delay; the bottleneck never runs faster than its rate.
        #[test]
        fn in_order_and_never_faster_than_the_rate(
            seed: u64,
            delay_ms in 0u64..200,
            jitter_ms in 0u64..20,
            rate_kbit in 1_000u64..1_000_000,
            gaps in prop::collection::vec((0u64..2_000_000, 64u64..1500), 1..300),
        ) {
            let params = LinkParams {
                delay_us: delay_ms * 1000,
                jitter_us: jitter_ms * 1000,
                rate_kbit,
                queue: QueueLimit::Bytes(u64::MAX / 2),
                ..Default::default()
            };
            let mut link = Link::new(params, seed);
            let (mut now, mut last, mut bytes) = (0u64, 0u64, 0u64);
            for (gap, len) in gaps {
                now += gap;
                let at = deliver_at(link.handle_packet(now, len));
                bytes += len;
                prop_assert!(at >= last, "reordered without reorder_pct");
                prop_assert!(at + jitter_ms * MS >= now + delay_ms * MS);
                last = at;
            }
            // Everything accepted has been serialised by `busy_until`, no faster than the rate.
            let min_ns = (u128::from(bytes) * 8_000_000 / u128::from(rate_kbit)) as u64;
            prop_assert!(link.busy_until_ns >= min_ns);
        }

        /// The backlog never exceeds the queue limit by more than nothing: what is accepted fits.
        #[test]
        fn backlog_never_exceeds_the_queue(
            seed: u64,
            limit in 1_500u64..200_000,
            arrivals in prop::collection::vec((0u64..500_000, 64u64..1500), 1..500),
        ) {
            let params = LinkParams { rate_kbit: 50_000, queue: QueueLimit::Bytes(limit), ..Default::default() };
            let mut link = Link::new(params, seed);
            let mut now = 0;
            for (gap, len) in arrivals {
                now += gap;
                link.handle_packet(now, len);
                prop_assert!(link.backlog_bytes(now) <= limit);
            }
        }
    }
}
