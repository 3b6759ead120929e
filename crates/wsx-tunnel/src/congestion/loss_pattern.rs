//! Telling congestion from a bad line by the pattern of the losses.
//!
//! A loss-based controller (NewReno, CUBIC) halves its rate at every loss, so at 1 % random
//! loss on a 100 ms path it runs at a few Mbit/s whatever the link's capacity. But a lost
//! packet is only evidence of congestion when the loss has the marks of a full queue:
//!
//! 1. **Loss with RTT inflation.** A drop-tail queue drops only when it is full, and a full
//!    queue delays every packet behind it: losses while the RTT stands well above its minimum
//!    are overflow. Losses while the RTT sits at its floor are not this flow's queue.
//! 2. **Loss above the line's own loss rate.** A damaged line loses a steady fraction of
//!    packets whatever the rate; a bottleneck (or a policer) loses more the more is sent. The
//!    classifier learns the line's rate of loss *runs* (consecutive lost packets count once)
//!    from rounds without a queue's marks and calls a round congested when its runs exceed
//!    what that rate explains: more than `n·r + 3·√(n·r·(1-r)) + 3` of `n` packets (a
//!    one-sided 3σ bound plus slack for small rounds), so at 5 % random loss a 900-packet
//!    round needs ~65 runs, where 43 are expected, to count. Runs and not packets, because a line that
//!    loses in bursts loses several packets at a time: its count of lost packets varies from
//!    round to round by whole bursts, and a bound on packets took every few rounds of a
//!    bursty line for congestion. Rounds judged by this rule alone still teach the rate: the
//!    first rounds are small and can teach a rate well below the line's, and if such rounds
//!    taught nothing, every later round would exceed the low estimate, the rate would be cut
//!    each time, and the estimate would never be corrected (a 5 % loss line held at a few
//!    Mbit/s). A policer's excess shows only in the rounds that probe above its rate, and
//!    raises the rate only briefly.
//! 3. **Clustered loss.** Paced packets are spread out, so independent losses rarely hit
//!    several consecutive packets (three in a row at 5 % loss: p³ = 1.25e-4 per packet). Long
//!    runs happen when a queue overflows under a burst, a policer empties its bucket, or a
//!    link goes down, and on lines that lose in bursts (radio, a flapping line card). The
//!    classifier learns the line's own rate of runs of three or more in the same rounds and
//!    calls a round congested when it has more than that rate explains (`n·c + 3·√(n·c) + 1`;
//!    before anything is learned, two in one round). A line with bursts of three at 1 % loss
//!    makes about one long run per round at 100 Mbit/s; two in one round used to be taken
//!    for congestion every third round or so.
//!
//! Runs are found among the last 16 losses in whatever order they are learned: a run's
//! losses can be declared by the sender and reported rebuilt by the peer in different ACKs.
//!
//! The reaction is not a halving: the controller resets its bandwidth estimate to the rate
//! the path delivered during the episode. Under true congestion that is the bottleneck's rate;
//! if a random burst was misjudged, the delivered rate is close to the sending rate anyway, so
//! a false positive costs little.
//!
//! Only losses of packets sent after the last reaction are judged, so one overflow episode,
//! whose losses are detected over a whole RTT, causes one reaction.

use crate::congestion::LostPacket;
use std::time::{Duration, Instant};

/// Rounds, and packets in them, before the learned rates are trusted: at 5 % loss, 1,000
/// packets put the estimate within 0.7 % (one standard deviation), where the first few small
/// rounds of a start can be off by half.
const BASELINE_ROUNDS: u32 = 4;
const BASELINE_PACKETS: u64 = 1000;
/// Rounds with fewer packets than this teach nothing about the line.
const BASELINE_MIN_PACKETS: u64 = 20;
/// Consecutive lost packets that make a long run (a cluster).
const CLUSTER_LEN: u64 = 3;
/// Recent lost packet numbers kept to find a loss's neighbours: losses of one run can be
/// learned from different ACKs, and in any order.
const RECENT_LOST: usize = 16;

/// Why a loss was judged to be congestion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    Inflation,
    Excess,
    Cluster,
}

/// What a round saw (see [`LossPattern::on_round_end`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RoundSeen {
    /// Packets acknowledged or lost.
    pub(crate) packets: u64,
    /// Lost and not rebuilt by the peer.
    pub(crate) unrepaired: u64,
    /// No loss of the round was judged congestion, and it showed no queue's marks.
    pub(crate) clean: bool,
}

/// Loss runs counted over some packets: runs of consecutive lost packets, and those of
/// them at least [`CLUSTER_LEN`] long.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Runs {
    packets: u64,
    runs: i64,
    long: i64,
}

impl Runs {
    fn add(&mut self, delta: RunDelta) {
        self.runs += delta.runs;
        self.long += delta.long;
    }
}

/// How one more lost packet changes the count of runs: a new run (+1), a run made longer
/// (0), or two runs joined into one (-1); the same for long runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct RunDelta {
    runs: i64,
    long: i64,
}

/// A rate per packet learned from rounds (an average weighted 1/8 towards each new round).
#[derive(Debug, Clone, Copy, Default)]
struct Learned {
    rate: f64,
    rounds: u32,
    packets: u64,
}

impl Learned {
    fn learn(&mut self, count: i64, packets: u64) {
        let fraction = count.max(0) as f64 / packets as f64;
        self.rate = if self.rounds == 0 {
            fraction
        } else {
            (self.rate * 7.0 + fraction) / 8.0
        };
        self.rounds = self.rounds.saturating_add(1);
        self.packets = self.packets.saturating_add(packets);
    }

    fn trusted(&self) -> Option<f64> {
        (self.rounds >= BASELINE_ROUNDS && self.packets >= BASELINE_PACKETS).then_some(self.rate)
    }
}

/// More than `n` packets at `rate` per packet explain: a one-sided 3σ bound plus `slack`.
fn above(count: i64, n: u64, rate: f64, slack: f64) -> bool {
    let expected = n as f64 * rate;
    let bound = expected + 3.0 * (expected * (1.0 - rate)).sqrt() + slack;
    count as f64 > bound
}

#[derive(Debug)]
pub(crate) struct LossPattern {
    /// Runs among the packets of the current round since the last reaction (judged).
    judged: Runs,
    /// The same over the whole round (what the round teaches about the line).
    round: Runs,
    round_lost: u64,
    /// This round's losses the peer rebuilt from parity, and whether any of its losses was
    /// judged congestion.
    round_repaired: u64,
    round_judged_congestion: bool,
    /// Largest RTT sample of the current round.
    round_max_rtt: Duration,
    /// Loss runs per packet, and long runs per packet, learned from uncongested rounds.
    base_runs: Learned,
    base_long: Learned,
    /// The last reaction; losses of packets sent before it are not judged again.
    reacted_at: Option<Instant>,
    /// Whether the current round showed a queue's marks, inflation or clusters (then it
    /// does not teach the base rates).
    congested: bool,
    /// The last [`RECENT_LOST`] lost packet numbers, oldest overwritten first.
    recent: [u64; RECENT_LOST],
    recent_next: usize,
}

impl LossPattern {
    pub(crate) fn new() -> Self {
        Self {
            judged: Runs::default(),
            round: Runs::default(),
            round_lost: 0,
            round_repaired: 0,
            round_judged_congestion: false,
            round_max_rtt: Duration::ZERO,
            base_runs: Learned::default(),
            base_long: Learned::default(),
            reacted_at: None,
            congested: false,
            recent: [u64::MAX; RECENT_LOST],
            recent_next: 0,
        }
    }

    /// The learned rate of loss runs per packet, once trusted.
    #[cfg(test)]
    fn base_runs(&self) -> Option<f64> {
        self.base_runs.trusted()
    }

    pub(crate) fn on_ack(&mut self, packets: u64, rtt_sample: Option<Duration>) {
        self.judged.packets += packets;
        self.round.packets += packets;
        if let Some(rtt) = rtt_sample {
            self.round_max_rtt = self.round_max_rtt.max(rtt);
        }
    }

    /// A round ended: learn from it and start the next. Returns what it saw.
    pub(crate) fn on_round_end(&mut self) -> RoundSeen {
        let n = self.round.packets;
        let seen = RoundSeen {
            packets: n,
            unrepaired: self.round_lost.saturating_sub(self.round_repaired),
            clean: !self.congested && !self.round_judged_congestion,
        };
        if !self.congested && n >= BASELINE_MIN_PACKETS {
            self.base_runs.learn(self.round.runs, n);
            self.base_long.learn(self.round.long, n);
        }
        self.judged = Runs::default();
        self.round = Runs::default();
        self.round_lost = 0;
        self.round_repaired = 0;
        self.round_judged_congestion = false;
        self.round_max_rtt = Duration::ZERO;
        self.congested = false;
        seen
    }

    /// Judges newly lost packets. `inflation` is the RTT rise over `min_rtt` that marks a full
    /// queue in the controller's current phase. Returns the cause when this is congestion the
    /// controller should react to; the caller then calls [`Self::reacted`].
    pub(crate) fn on_loss(
        &mut self,
        lost: &[LostPacket],
        min_rtt: Duration,
        inflation: Duration,
    ) -> Option<Cause> {
        let mut judged = false;
        for p in lost {
            let Some(delta) = self.remember(p.number) else {
                continue;
            };
            self.round_lost += 1;
            self.round_repaired += u64::from(p.repaired);
            self.round.packets += 1;
            self.round.add(delta);
            if self.reacted_at.is_some_and(|at| p.sent < at) {
                continue;
            }
            judged = true;
            self.judged.packets += 1;
            self.judged.add(delta);
        }
        if !judged {
            return None;
        }
        let cause = if self.round_max_rtt > min_rtt + inflation {
            Some(Cause::Inflation)
        } else if self.excess() {
            Some(Cause::Excess)
        } else if self.clustered() {
            Some(Cause::Cluster)
        } else {
            None
        };
        self.congested |= matches!(cause, Some(Cause::Inflation | Cause::Cluster));
        self.round_judged_congestion |= cause.is_some();
        cause
    }

    /// Records a lost packet and returns how it changes the runs (`None`: already known).
    fn remember(&mut self, number: u64) -> Option<RunDelta> {
        if self.recent.contains(&number) {
            return None;
        }
        let extent = |step: fn(u64, u64) -> Option<u64>| {
            (1..=RECENT_LOST as u64)
                .take_while(|&k| step(number, k).is_some_and(|n| self.recent.contains(&n)))
                .count() as u64
        };
        let before = extent(u64::checked_sub);
        let after = extent(u64::checked_add);
        self.recent[self.recent_next] = number;
        self.recent_next = (self.recent_next + 1) % RECENT_LOST;
        let long = |len: u64| i64::from(len >= CLUSTER_LEN);
        Some(RunDelta {
            runs: 1 - i64::from(before > 0) - i64::from(after > 0),
            long: long(before + after + 1) - long(before) - long(after),
        })
    }

    /// Whether this round's loss runs exceed what the line's learned rate explains. Runs,
    /// not packets: a line that loses in bursts loses several packets at a time, and its
    /// count of lost packets varies by as many from round to round.
    fn excess(&self) -> bool {
        let Some(rate) = self.base_runs.trusted() else {
            return false;
        };
        let n = self.judged.packets;
        n >= BASELINE_MIN_PACKETS && above(self.judged.runs, n, rate, 3.0)
    }

    /// Whether this round has more long runs than the line's learned rate of them explains
    /// (before it is learned, more than one).
    fn clustered(&self) -> bool {
        let rate = self.base_long.trusted().unwrap_or(0.0);
        above(self.judged.long, self.judged.packets, rate, 1.0)
    }

    /// The controller lowered its rate at `now`.
    pub(crate) fn reacted(&mut self, now: Instant) {
        self.reacted_at = Some(now);
        self.judged = Runs::default();
        self.round_max_rtt = Duration::ZERO;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost(numbers: impl IntoIterator<Item = u64>, sent: Instant) -> Vec<LostPacket> {
        numbers
            .into_iter()
            .map(|number| LostPacket {
                number,
                bytes: 1200,
                sent,
                repaired: false,
            })
            .collect()
    }

    const MIN: Duration = Duration::from_millis(100);
    const INFLATION: Duration = Duration::from_millis(25);

    /// Teaches the classifier `rounds` rounds of 1000 packets with `per_round` scattered losses.
    fn learn(pattern: &mut LossPattern, t: Instant, rounds: u64, per_round: u64) {
        for round in 0..rounds {
            pattern.on_ack(1000 - per_round, Some(MIN));
            let base = round * 10_000;
            let numbers = (0..per_round).map(|i| base + i * 37);
            assert_eq!(pattern.on_loss(&lost(numbers, t), MIN, INFLATION), None);
            pattern.on_round_end();
        }
    }

    #[test]
    fn steady_random_loss_is_not_congestion() {
        let t = crate::test_epoch();
        let mut pattern = LossPattern::new();
        learn(&mut pattern, t, 10, 50);
        let p = pattern.base_runs().unwrap();
        assert!((p - 0.05).abs() < 1e-9, "{p}");
    }

    #[test]
    fn loss_well_above_the_learned_rate_is_congestion() {
        let t = crate::test_epoch();
        let mut pattern = LossPattern::new();
        learn(&mut pattern, t, 6, 10);
        pattern.on_ack(900, Some(MIN));
        let numbers = (0..100).map(|i| 1_000_000 + i * 5);
        assert_eq!(
            pattern.on_loss(&lost(numbers, t), MIN, INFLATION),
            Some(Cause::Excess)
        );
    }

    #[test]
    fn a_loss_rate_learned_too_low_is_corrected() {
        let t = crate::test_epoch();
        let mut pattern = LossPattern::new();
        // Small first rounds saw 1 % loss; the line loses 5 %.
        learn(&mut pattern, t, 4, 10);
        let mut verdicts = 0;
        for round in 0..40u64 {
            pattern.on_ack(950, Some(MIN));
            let numbers = (0..50).map(|i| 1_000_000 + round * 10_000 + i * 19);
            if pattern.on_loss(&lost(numbers, t), MIN, INFLATION).is_some() {
                verdicts += 1;
                pattern.reacted(t);
            }
            pattern.on_round_end();
        }
        assert!(verdicts < 10, "{verdicts} excess verdicts");
        let p = pattern.base_runs().unwrap_or_default();
        assert!(p > 0.04, "{p}");
    }

    #[test]
    fn loss_while_the_rtt_is_inflated_is_congestion() {
        let t = crate::test_epoch();
        let mut pattern = LossPattern::new();
        pattern.on_ack(10, Some(MIN + INFLATION + Duration::from_millis(1)));
        assert_eq!(
            pattern.on_loss(&lost([5], t), MIN, INFLATION),
            Some(Cause::Inflation)
        );
    }

    #[test]
    fn two_runs_of_three_are_congestion_and_one_is_not() {
        let t = crate::test_epoch();
        let mut pattern = LossPattern::new();
        pattern.on_ack(500, Some(MIN));
        assert_eq!(
            pattern.on_loss(&lost([10, 11, 12], t), MIN, INFLATION),
            None
        );
        // A run continues across loss events.
        assert_eq!(pattern.on_loss(&lost([40, 41], t), MIN, INFLATION), None);
        assert_eq!(
            pattern.on_loss(&lost([42], t), MIN, INFLATION),
            Some(Cause::Cluster)
        );
    }

    /// A run is one run whatever order its losses are learned in (a packet declared lost
    /// by the sender, its neighbours reported rebuilt by the peer later), and a loss that
    /// joins two runs makes them one.
    #[test]
    fn a_run_learned_out_of_order_is_one_run() {
        let t = crate::test_epoch();
        let mut pattern = LossPattern::new();
        pattern.on_ack(500, Some(MIN));
        for number in [12, 10, 20, 21, 11] {
            assert_eq!(pattern.on_loss(&lost([number], t), MIN, INFLATION), None);
        }
        assert_eq!(
            pattern.judged,
            Runs {
                packets: 505,
                runs: 2,
                long: 1
            }
        );
        // 13 joins 10-12 with 14-16: one long run of seven instead of two.
        assert_eq!(
            pattern.on_loss(&lost([14, 15, 16], t), MIN, INFLATION),
            Some(Cause::Cluster)
        );
        pattern.reacted(t);
        pattern.on_ack(10, Some(MIN));
        assert_eq!(pattern.on_loss(&lost([13], t), MIN, INFLATION), None);
        assert_eq!(
            pattern.round,
            Runs {
                packets: 519,
                runs: 2,
                long: 1
            }
        );
        // A loss reported twice counts once.
        assert_eq!(pattern.on_loss(&lost([13], t), MIN, INFLATION), None);
        assert_eq!(pattern.round.packets, 519);
    }

    /// A line that loses in runs of three, about one per round: once its rate of long runs
    /// is learned, a round with three of them is the line, but ten are still congestion.
    #[test]
    fn a_line_that_loses_in_runs_is_learned() {
        let t = crate::test_epoch();
        let mut pattern = LossPattern::new();
        let round = |pattern: &mut LossPattern, number: u64, runs: u64| {
            pattern.on_ack(1000 - 3 * runs, Some(MIN));
            let base = number * 10_000;
            let numbers = (0..runs).flat_map(|r| (0..3).map(move |i| base + r * 100 + i));
            let cause = pattern.on_loss(&lost(numbers, t), MIN, INFLATION);
            pattern.on_round_end();
            cause
        };
        // Before anything is learned, two runs of three in a round are congestion.
        assert_eq!(round(&mut pattern, 0, 2), Some(Cause::Cluster));
        for number in 1..5 {
            assert_eq!(round(&mut pattern, number, 1), None);
        }
        for number in 5..20 {
            assert_eq!(round(&mut pattern, number, 3), None, "round {number}");
        }
        assert!(round(&mut pattern, 20, 12).is_some());
    }

    /// What a round reports for the controller's line-loss rate: losses the peer rebuilt
    /// are not the sender's to make up for (they count as delivered), and a round with a
    /// congestion verdict is not clean.
    #[test]
    fn a_round_reports_its_unrepaired_losses_and_whether_it_was_clean() {
        let t = crate::test_epoch();
        let mut pattern = LossPattern::new();
        pattern.on_ack(990, Some(MIN));
        let mut losses = lost([5, 50, 90, 130], t);
        losses[1].repaired = true;
        losses[3].repaired = true;
        assert_eq!(pattern.on_loss(&losses, MIN, INFLATION), None);
        let seen = pattern.on_round_end();
        assert_eq!(
            seen,
            RoundSeen {
                packets: 994,
                unrepaired: 2,
                clean: true
            }
        );
        pattern.on_ack(500, Some(MIN));
        assert_eq!(
            pattern.on_loss(&lost([10, 11, 12, 40, 41, 42], t), MIN, INFLATION),
            Some(Cause::Cluster)
        );
        assert!(!pattern.on_round_end().clean);
    }

    #[test]
    fn losses_sent_before_a_reaction_are_not_judged_again() {
        let t = crate::test_epoch();
        let later = t + Duration::from_millis(50);
        let mut pattern = LossPattern::new();
        pattern.on_ack(10, Some(MIN * 2));
        assert!(pattern.on_loss(&lost([1], t), MIN, INFLATION).is_some());
        pattern.reacted(later);
        pattern.on_ack(10, Some(MIN * 2));
        assert_eq!(pattern.on_loss(&lost([2, 3, 4], t), MIN, INFLATION), None);
        assert!(pattern.on_loss(&lost([9], later), MIN, INFLATION).is_some());
    }
}
