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
//!    classifier learns the random-loss rate `p` from rounds without a queue's marks and calls
//!    a round congested when its losses exceed what `p` explains: more than
//!    `n·p + 3·√(n·p·(1-p)) + 3` of `n` packets (a one-sided 3σ bound plus slack for small
//!    rounds), so at 5 % random loss a 900-packet round needs ~68 losses, not 45, to count.
//!    Rounds judged by this rule alone still teach `p`: the first rounds are small and can
//!    teach a rate well below the line's, and if such rounds taught nothing, every later
//!    round would exceed the low estimate, the rate would be cut each time, and the estimate
//!    would never be corrected (a 5 % loss line held at a few Mbit/s). A policer's excess
//!    shows only in the rounds that probe above its rate, and raises `p` only briefly.
//! 3. **Clustered loss.** Paced packets are spread out, so independent losses rarely hit
//!    several consecutive packets (three in a row at 5 % loss: p³ = 1.25e-4 per packet). Runs
//!    happen when a queue overflows under a burst or a link goes down. Two runs of three or
//!    more in one round count as congestion.
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

/// Rounds, and packets in them, before the learned random-loss rate is trusted: at 5 % loss,
/// 1,000 packets put the estimate within 0.7 % (one standard deviation), where the first
/// few small rounds of a start can be off by half.
const BASELINE_ROUNDS: u32 = 4;
const BASELINE_PACKETS: u64 = 1000;
/// Rounds with fewer packets than this teach nothing about the loss rate.
const BASELINE_MIN_PACKETS: u64 = 20;
/// Consecutive lost packets that make a cluster.
const CLUSTER_LEN: u64 = 3;
/// Clusters in one round that make congestion.
const CLUSTERS_FOR_CONGESTION: u32 = 2;

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

#[derive(Debug)]
pub(crate) struct LossPattern {
    /// Packets acknowledged and lost in the current round since the last reaction (judged).
    acked: u64,
    lost: u64,
    /// The same over the whole round (what the round teaches about the line).
    round_acked: u64,
    round_lost: u64,
    /// This round's losses the peer rebuilt from parity, and whether any of its losses was
    /// judged congestion.
    round_repaired: u64,
    round_judged_congestion: bool,
    clusters: u32,
    /// Largest RTT sample of the current round.
    round_max_rtt: Duration,
    /// The random-loss rate learned from uncongested rounds.
    base_loss: f64,
    base_rounds: u32,
    base_packets: u64,
    /// The last reaction; losses of packets sent before it are not judged again.
    reacted_at: Option<Instant>,
    /// Whether the current round showed a queue's marks, inflation or clusters (then it
    /// does not teach the base rate).
    congested: bool,
    /// Last lost packet number and the length of the run it ends, across loss events.
    run_end: u64,
    run_len: u64,
}

impl LossPattern {
    pub(crate) fn new() -> Self {
        Self {
            acked: 0,
            lost: 0,
            round_acked: 0,
            round_lost: 0,
            round_repaired: 0,
            round_judged_congestion: false,
            clusters: 0,
            round_max_rtt: Duration::ZERO,
            base_loss: 0.0,
            base_rounds: 0,
            base_packets: 0,
            reacted_at: None,
            congested: false,
            run_end: u64::MAX,
            run_len: 0,
        }
    }

    /// The learned random-loss rate, once trusted.
    pub(crate) fn base_loss(&self) -> Option<f64> {
        (self.base_rounds >= BASELINE_ROUNDS && self.base_packets >= BASELINE_PACKETS)
            .then_some(self.base_loss)
    }

    pub(crate) fn on_ack(&mut self, packets: u64, rtt_sample: Option<Duration>) {
        self.acked += packets;
        self.round_acked += packets;
        if let Some(rtt) = rtt_sample {
            self.round_max_rtt = self.round_max_rtt.max(rtt);
        }
    }

    /// A round ended: learn from it and start the next. Returns what it saw.
    pub(crate) fn on_round_end(&mut self) -> RoundSeen {
        let n = self.round_acked + self.round_lost;
        let seen = RoundSeen {
            packets: n,
            unrepaired: self.round_lost.saturating_sub(self.round_repaired),
            clean: !self.congested && !self.round_judged_congestion,
        };
        if !self.congested && n >= BASELINE_MIN_PACKETS {
            let fraction = self.round_lost as f64 / n as f64;
            self.base_loss = if self.base_rounds == 0 {
                fraction
            } else {
                (self.base_loss * 7.0 + fraction) / 8.0
            };
            self.base_rounds = self.base_rounds.saturating_add(1);
            self.base_packets = self.base_packets.saturating_add(n);
        }
        self.acked = 0;
        self.lost = 0;
        self.round_acked = 0;
        self.round_lost = 0;
        self.round_repaired = 0;
        self.round_judged_congestion = false;
        self.clusters = 0;
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
        self.round_lost += lost.len() as u64;
        self.round_repaired += lost.iter().filter(|p| p.repaired).count() as u64;
        let mut judged = 0;
        for p in lost {
            if self.reacted_at.is_some_and(|at| p.sent < at) {
                continue;
            }
            judged += 1;
            if self.run_end != u64::MAX && p.number == self.run_end + 1 {
                self.run_len += 1;
            } else {
                self.run_len = 1;
            }
            self.run_end = p.number;
            if self.run_len == CLUSTER_LEN {
                self.clusters += 1;
            }
        }
        if judged == 0 {
            return None;
        }
        self.lost += judged;
        let cause = if self.round_max_rtt > min_rtt + inflation {
            Some(Cause::Inflation)
        } else if self.excess() {
            Some(Cause::Excess)
        } else if self.clusters >= CLUSTERS_FOR_CONGESTION {
            Some(Cause::Cluster)
        } else {
            None
        };
        self.congested |= matches!(cause, Some(Cause::Inflation | Cause::Cluster));
        self.round_judged_congestion |= cause.is_some();
        cause
    }

    /// Whether this round's losses exceed what the learned random-loss rate explains.
    fn excess(&self) -> bool {
        let Some(p) = self.base_loss() else {
            return false;
        };
        let n = self.acked + self.lost;
        if n < BASELINE_MIN_PACKETS {
            return false;
        }
        let n = n as f64;
        let expected = n * p;
        let bound = expected + 3.0 * (expected * (1.0 - p)).sqrt() + 3.0;
        self.lost as f64 > bound
    }

    /// The controller lowered its rate at `now`.
    pub(crate) fn reacted(&mut self, now: Instant) {
        self.reacted_at = Some(now);
        self.clusters = 0;
        self.lost = 0;
        self.acked = 0;
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
        let p = pattern.base_loss().unwrap();
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
        let p = pattern.base_loss().unwrap_or_default();
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
