//! Telling congestion from a bad line by the pattern of the losses.
//!
//! A loss-based controller (NewReno, CUBIC) halves its rate at every loss, so at 1 % random
//! loss on a 100 ms path it runs at a few Mbit/s whatever the link's capacity. But a lost
//! packet is only evidence of congestion when the loss has the marks of a full queue:
//!
//! 1. **Loss with RTT inflation.** A drop-tail queue drops only when it is full, and a full
//!    queue delays every packet behind it: losses while the RTT stands well above its minimum
//!    are overflow. Losses while the RTT sits at its floor are not this flow's queue.
//!    "Stands": every sample above the mark for at least [`STANDING`]. A full queue stays
//!    full, every sample above the mark, until the sender backs off, while a host on the
//!    way held off the CPU (a receiver that acknowledges late, a sender that reads a
//!    backlog of ACKs at once) hands back what it held within a moment. In the lab, on a machine
//!    whose CPU the hypervisor withheld 11-40 % of the time, one such late sample with a
//!    random loss in its round ended Rapid Start at 1-20 % of the path's rate in half of
//!    the runs at 5 % loss.
//! 2. **Loss above the line's own loss rate.** A damaged line loses a steady fraction of
//!    packets whatever the rate; a bottleneck (or a policer) loses more the more is sent. The
//!    classifier learns the line's rate of loss *runs* (consecutive lost packets count once)
//!    from rounds without a queue's marks and calls a round congested when its runs exceed
//!    what that rate explains: more than `n·r + 3·√(n·r·(1-r)) + 3` of `n` packets (a
//!    one-sided 3σ bound plus slack for small rounds), so at 5 % random loss a 900-packet
//!    round needs ~65 runs, where 43 are expected, to count. Runs and not packets, because
//!    a line that loses in bursts loses several packets at a time: its count of lost
//!    packets varies from round to round by whole bursts, and a bound on packets took every
//!    few rounds of a bursty line for congestion. Rounds judged by this rule alone still
//!    teach the rate: the first rounds are small and can teach a rate well below the
//!    line's, and if such rounds taught nothing, every later round would exceed the low
//!    estimate, the rate would be cut each time, and the estimate would never be corrected
//!    (a 5 % loss line held at a few Mbit/s). A policer's excess shows only in the rounds
//!    that probe above its rate, and raises the rate only briefly.
//! 3. **Clustered loss.** Packets leave in paced bursts of a millisecond or two, with other
//!    traffic between them, so independent losses rarely hit several consecutive packets
//!    (three in a row at 5 % loss: p³ = 1.25e-4 per packet). Long runs happen when a queue
//!    overflows under a burst or a policer empties its bucket, and on lines that lose in
//!    bursts (radio, a flapping line card). The classifier learns the line's own rate of
//!    runs of three or more and calls a round congested when it has more than that rate
//!    explains (`n·c + 3·√(n·c·(1-c)) + 1`, `n` at least the last round's packets so that
//!    the first ACKs of a round are not judged on a handful; before anything is learned,
//!    two in one round). A round judged congestion teaches the rate at most one long run
//!    more than it allowed: a line's bursts are still learned when most rounds exceed a
//!    bound learned too low, and an overflow's runs raise it only a little. A line with
//!    bursts of three at 1 % loss makes about one long run per round at 100 Mbit/s; two in
//!    one round used to be taken for congestion every third round or so.
//!
//! One run, however long, is not congestion: a link down for a few milliseconds loses a
//! run of packets and then carries its rate again. A second long run in the round is (see
//! the tests); a link that stays down is persistent congestion (`recovery`).
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
use wsx_fec::policy::RecentLosses;

/// Rounds, and packets in them, before the learned rates are trusted: at 5 % loss, 1,000
/// packets put the estimate within 0.7 % (one standard deviation), where the first few small
/// rounds of a start can be off by half.
const BASELINE_ROUNDS: u32 = 4;
const BASELINE_PACKETS: u64 = 1000;
/// Rounds with fewer packets than this teach nothing about the line.
const BASELINE_MIN_PACKETS: u64 = 20;
/// How long RTT samples must stay above the mark of a queue for the queue to stand: longer
/// than a host's backlog takes to come back once it is given the CPU again; a queue that
/// overflows stays above the mark until the sender reacts, so this delays the verdict on
/// it by at most this and an ACK's spacing.
const STANDING: Duration = Duration::from_millis(4);
/// Consecutive lost packets that make a long run (a cluster).
pub(crate) const CLUSTER_LEN: u64 = 3;

/// Why a loss was judged to be congestion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    Inflation,
    Excess,
    Cluster,
}

/// Losses counted over some packets: the runs of consecutive lost ones, and those runs at
/// least [`CLUSTER_LEN`] long.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Runs {
    packets: u64,
    runs: i64,
    long: i64,
}

impl Runs {
    fn add_lost(&mut self, delta: RunDelta) {
        self.packets += 1;
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

/// What the line loses when nothing is congested: loss runs and long runs per packet,
/// learned from rounds (each rate an average weighted 1/8 towards each new round).
#[derive(Debug, Clone, Copy, Default)]
struct Line {
    runs: f64,
    long: f64,
    /// Rounds (and their packets) that taught the rate of runs, and the rate of long runs.
    rounds: u32,
    packets: u64,
    long_rounds: u32,
    long_packets: u64,
}

fn toward(old: f64, new: f64, first: bool) -> f64 {
    if first { new } else { (old * 7.0 + new) / 8.0 }
}

/// `expected` plus three standard deviations of a count of rare events at `rate` per
/// packet (binomial), plus `slack`.
fn bound(n: u64, rate: f64, slack: f64) -> f64 {
    let expected = n as f64 * rate;
    expected + 3.0 * (expected * (1.0 - rate)).sqrt() + slack
}

impl Line {
    fn trusted(&self) -> bool {
        self.rounds >= BASELINE_ROUNDS && self.packets >= BASELINE_PACKETS
    }

    fn long_trusted(&self) -> bool {
        self.long_rounds >= BASELINE_ROUNDS && self.long_packets >= BASELINE_PACKETS
    }

    /// The most loss runs among `n` packets the line explains, once learned (slack for
    /// small rounds).
    fn runs_bound(&self, n: u64) -> Option<f64> {
        self.trusted().then(|| bound(n, self.runs, 3.0))
    }

    /// The most long runs among `n` packets the line explains (before it is learned, one).
    fn long_bound(&self, n: u64) -> f64 {
        bound(n, if self.long_trusted() { self.long } else { 0.0 }, 1.0)
    }

    /// Learns from a round. A round judged congestion teaches the rate of long runs at most
    /// one more than it allowed, so that a line's bursts are learned even while they are
    /// above the bound (if only rounds with fewer taught, a line with several per round
    /// would be learned far too low), while an overflow's runs raise it only a little; a
    /// round with clusters teaches nothing else.
    fn learn(&mut self, round: &Runs, judged: bool, clustered: bool) {
        let n = round.packets;
        let long = if judged {
            round.long.min(self.long_bound(n).floor() as i64 + 1)
        } else {
            round.long
        };
        let fraction = long.max(0) as f64 / n as f64;
        self.long = toward(self.long, fraction, self.long_rounds == 0);
        self.long_rounds = self.long_rounds.saturating_add(1);
        self.long_packets = self.long_packets.saturating_add(n);
        if clustered {
            return;
        }
        self.runs = toward(
            self.runs,
            round.runs.max(0) as f64 / n as f64,
            self.rounds == 0,
        );
        self.rounds = self.rounds.saturating_add(1);
        self.packets = self.packets.saturating_add(n);
    }
}

#[derive(Debug)]
pub(crate) struct LossPattern {
    /// Losses among the packets of the current round since the last reaction (judged).
    judged: Runs,
    /// The same over the whole round: what the round teaches. (Its ACKs do not say when
    /// their packets were sent, so the losses of packets sent before a reaction count here
    /// too; leaving them out would teach a rate below the line's.)
    round: Runs,
    /// Packets in the last round: the least a round's allowance of long runs is spread
    /// over, so that the first ACKs of a round or after a reaction do not judge on a
    /// handful of packets.
    last_round_packets: u64,
    /// Since when every RTT sample has been above the mark of a queue (see
    /// [`LossPattern::on_ack`]), when the last sample came, and whether the samples stood
    /// above it long enough in this round.
    inflated_since: Option<Instant>,
    sampled_at: Option<Instant>,
    round_inflated: bool,
    line: Line,
    /// The last reaction; losses of packets sent before it are not judged again.
    reacted_at: Option<Instant>,
    /// What the current round was judged: a queue's marks (inflation: it teaches nothing),
    /// clusters, or any congestion.
    inflated: bool,
    clustered: bool,
    judged_congestion: bool,
    /// The last few lost packet numbers, to find the run each new loss joins.
    recent: RecentLosses,
}

impl LossPattern {
    pub(crate) fn new() -> Self {
        Self {
            judged: Runs::default(),
            round: Runs::default(),
            last_round_packets: 0,
            inflated_since: None,
            sampled_at: None,
            round_inflated: false,
            line: Line::default(),
            reacted_at: None,
            inflated: false,
            clustered: false,
            judged_congestion: false,
            recent: RecentLosses::default(),
        }
    }

    /// The learned rate of loss runs, once trusted.
    #[cfg(test)]
    fn base_runs(&self) -> Option<f64> {
        self.line.trusted().then_some(self.line.runs)
    }

    /// Counts `packets` acknowledged at `now` by an ACK that gave `rtt_sample`. A sample
    /// more than `inflation` above `min_rtt` is a queue's mark (the controller's, by phase);
    /// the round has a standing queue once the samples have stayed above it for
    /// [`STANDING`].
    pub(crate) fn on_ack(
        &mut self,
        now: Instant,
        packets: u64,
        rtt_sample: Option<Duration>,
        min_rtt: Duration,
        inflation: Duration,
    ) {
        self.judged.packets += packets;
        self.round.packets += packets;
        let Some(rtt) = rtt_sample else {
            return;
        };
        // Samples a round trip apart (an idle spell, a sender held back) say nothing of
        // what the RTT did between them.
        if self
            .sampled_at
            .replace(now)
            .is_none_or(|last| now.saturating_duration_since(last) > min_rtt)
        {
            self.inflated_since = None;
        }
        if rtt > min_rtt + inflation {
            let since = *self.inflated_since.get_or_insert(now);
            self.round_inflated |= now.saturating_duration_since(since) >= STANDING;
        } else {
            self.inflated_since = None;
        }
    }

    /// A round ended: learn from it and start the next.
    pub(crate) fn on_round_end(&mut self) {
        if !self.inflated && self.round.packets >= BASELINE_MIN_PACKETS {
            self.line
                .learn(&self.round, self.judged_congestion, self.clustered);
        }
        self.last_round_packets = self.round.packets;
        self.judged = Runs::default();
        self.round = Runs::default();
        // A queue that still stands is the new round's too: the ACK that ends a round is
        // taken before its losses are judged.
        self.round_inflated = self
            .inflated_since
            .zip(self.sampled_at)
            .is_some_and(|(since, last)| last.saturating_duration_since(since) >= STANDING);
        self.inflated = false;
        self.clustered = false;
        self.judged_congestion = false;
    }

    /// Judges newly lost packets. Returns the cause when this is congestion the controller
    /// should react to; the caller then calls [`Self::reacted`].
    pub(crate) fn on_loss(&mut self, lost: &[LostPacket]) -> Option<Cause> {
        let mut judged = false;
        for p in lost {
            let Some(delta) = self.remember(p.number) else {
                continue;
            };
            self.round.add_lost(delta);
            if self.reacted_at.is_some_and(|at| p.sent < at) {
                continue;
            }
            judged = true;
            self.judged.add_lost(delta);
        }
        if !judged {
            return None;
        }
        let cause = if self.round_inflated {
            Some(Cause::Inflation)
        } else if self.excess() {
            Some(Cause::Excess)
        } else if self.has_clusters() {
            Some(Cause::Cluster)
        } else {
            None
        };
        self.inflated |= cause == Some(Cause::Inflation);
        self.clustered |= cause == Some(Cause::Cluster);
        self.judged_congestion |= cause.is_some();
        cause
    }

    /// Records a lost packet and returns how it changes the runs (`None`: already known).
    fn remember(&mut self, number: u64) -> Option<RunDelta> {
        let (before, after) = self.recent.remember(number)?;
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
        let n = self.judged.packets;
        n >= BASELINE_MIN_PACKETS
            && self
                .line
                .runs_bound(n)
                .is_some_and(|bound| self.judged.runs as f64 > bound)
    }

    /// Whether this round has more long runs than the line's learned rate of them explains.
    fn has_clusters(&self) -> bool {
        let n = self.judged.packets.max(self.last_round_packets);
        self.judged.long as f64 > self.line.long_bound(n)
    }

    /// The controller lowered its rate at `now`.
    pub(crate) fn reacted(&mut self, now: Instant) {
        self.reacted_at = Some(now);
        self.judged = Runs::default();
        self.round_inflated = false;
        self.inflated_since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::lost;
    use super::*;

    const MIN: Duration = Duration::from_millis(100);
    const INFLATION: Duration = Duration::from_millis(25);

    /// Teaches the classifier `rounds` rounds of 1000 packets with `per_round` scattered losses.
    fn learn(pattern: &mut LossPattern, t: Instant, rounds: u64, per_round: u64) {
        for round in 0..rounds {
            pattern.on_ack(t, 1000 - per_round, Some(MIN), MIN, INFLATION);
            let base = round * 10_000;
            let numbers = (0..per_round).map(|i| base + i * 37);
            assert_eq!(pattern.on_loss(&lost(numbers, t)), None);
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
        pattern.on_ack(t, 900, Some(MIN), MIN, INFLATION);
        let numbers = (0..100).map(|i| 1_000_000 + i * 5);
        assert_eq!(pattern.on_loss(&lost(numbers, t)), Some(Cause::Excess));
    }

    #[test]
    fn a_loss_rate_learned_too_low_is_corrected() {
        let t = crate::test_epoch();
        let mut pattern = LossPattern::new();
        // Small first rounds saw 1 % loss; the line loses 5 %.
        learn(&mut pattern, t, 4, 10);
        let mut verdicts = 0;
        for round in 0..40u64 {
            pattern.on_ack(t, 950, Some(MIN), MIN, INFLATION);
            let numbers = (0..50).map(|i| 1_000_000 + round * 10_000 + i * 19);
            if pattern.on_loss(&lost(numbers, t)).is_some() {
                verdicts += 1;
                pattern.reacted(t);
            }
            pattern.on_round_end();
        }
        assert!(verdicts < 10, "{verdicts} excess verdicts");
        let p = pattern.base_runs().unwrap_or_default();
        assert!(p > 0.04, "{p}");
    }

    /// Losses while the RTT stands inflated are overflow; a moment of late ACKs (a host on
    /// the way held off the CPU) is not an inflated RTT.
    #[test]
    fn loss_while_the_rtt_is_inflated_is_congestion() {
        let t = crate::test_epoch();
        let ms = Duration::from_millis(1);
        let inflated = Some(MIN + INFLATION + ms);
        let mut pattern = LossPattern::new();
        let mut ack = |at: Duration, rtt| pattern.on_ack(t + at, 10, rtt, MIN, INFLATION);
        // Late for 3 ms, then on time, then late again for 3 ms: never standing.
        ack(ms, inflated);
        ack(4 * ms, inflated);
        ack(5 * ms, Some(MIN));
        ack(6 * ms, inflated);
        ack(9 * ms, inflated);
        assert_eq!(pattern.on_loss(&lost([5], t)), None);
        // Late for 4 ms: a queue.
        pattern.on_ack(t + 10 * ms, 10, inflated, MIN, INFLATION);
        assert_eq!(pattern.on_loss(&lost([6], t)), Some(Cause::Inflation));
        // After the reaction the queue must stand again, in samples taken since.
        pattern.reacted(t + 10 * ms);
        pattern.on_ack(t + 20 * ms, 10, inflated, MIN, INFLATION);
        assert_eq!(pattern.on_loss(&lost([9], t + 20 * ms)), None);
        pattern.on_ack(t + 24 * ms, 10, inflated, MIN, INFLATION);
        // A round that ends with the queue standing starts with it.
        pattern.on_round_end();
        assert_eq!(
            pattern.on_loss(&lost([10], t + 20 * ms)),
            Some(Cause::Inflation)
        );
    }

    #[test]
    fn two_runs_of_three_are_congestion_and_one_is_not() {
        let t = crate::test_epoch();
        let mut pattern = LossPattern::new();
        pattern.on_ack(t, 500, Some(MIN), MIN, INFLATION);
        assert_eq!(pattern.on_loss(&lost([10, 11, 12], t)), None);
        // A run continues across loss events.
        assert_eq!(pattern.on_loss(&lost([40, 41], t)), None);
        assert_eq!(pattern.on_loss(&lost([42], t)), Some(Cause::Cluster));
    }

    /// A run is one run whatever order its losses are learned in (a packet declared lost
    /// by the sender, its neighbours reported rebuilt by the peer later), and a loss that
    /// joins two runs makes them one.
    #[test]
    fn a_run_learned_out_of_order_is_one_run() {
        let t = crate::test_epoch();
        let mut pattern = LossPattern::new();
        pattern.on_ack(t, 500, Some(MIN), MIN, INFLATION);
        for number in [12, 10, 20, 21, 11] {
            assert_eq!(pattern.on_loss(&lost([number], t)), None);
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
            pattern.on_loss(&lost([14, 15, 16], t)),
            Some(Cause::Cluster)
        );
        pattern.reacted(t);
        pattern.on_ack(t, 10, Some(MIN), MIN, INFLATION);
        assert_eq!(pattern.on_loss(&lost([13], t)), None);
        assert_eq!(
            pattern.round,
            Runs {
                packets: 519,
                runs: 2,
                long: 1
            }
        );
        // A loss reported twice counts once.
        assert_eq!(pattern.on_loss(&lost([13], t)), None);
        assert_eq!(pattern.round.packets, 519);
    }

    /// A line that loses in runs of three, about one per round: once its rate of long runs
    /// is learned, a round with three of them is the line, but ten are still congestion.
    #[test]
    fn a_line_that_loses_in_runs_is_learned() {
        let t = crate::test_epoch();
        let mut pattern = LossPattern::new();
        let round = |pattern: &mut LossPattern, number: u64, runs: u64| {
            pattern.on_ack(t, 1000 - 3 * runs, Some(MIN), MIN, INFLATION);
            let base = number * 10_000;
            let numbers = (0..runs).flat_map(|r| (0..3).map(move |i| base + r * 100 + i));
            let cause = pattern.on_loss(&lost(numbers, t));
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

    /// One run of 40 packets on a line learned at 1 % random loss (a link that was down
    /// for a few milliseconds) is one run and one long run: not congestion, the rate
    /// stands. A second long run in the round is.
    #[test]
    fn one_outage_is_not_congestion_but_two_are() {
        let t = crate::test_epoch();
        let mut pattern = LossPattern::new();
        learn(&mut pattern, t, 6, 10);
        pattern.on_ack(t, 860, Some(MIN), MIN, INFLATION);
        let numbers = (0..40).map(|i| 1_000_000 + i);
        assert_eq!(pattern.on_loss(&lost(numbers, t)), None);
        let numbers = (0..40).map(|i| 1_000_100 + i);
        assert_eq!(pattern.on_loss(&lost(numbers, t)), Some(Cause::Cluster));
    }

    /// A line whose every round has several runs of three, from the first: each round is
    /// judged congestion until the rate of long runs is learned, which takes a few rounds,
    /// not forever.
    #[test]
    fn a_line_bursty_from_the_start_is_learned() {
        let t = crate::test_epoch();
        let mut pattern = LossPattern::new();
        let mut verdicts = [0; 2];
        for number in 0..40u64 {
            pattern.on_ack(t, 991, Some(MIN), MIN, INFLATION);
            let base = number * 10_000;
            let numbers = (0..3).flat_map(|r| (0..3).map(move |i| base + r * 100 + i));
            if pattern.on_loss(&lost(numbers, t)).is_some() {
                verdicts[usize::from(number >= 20)] += 1;
                pattern.reacted(t);
            }
            pattern.on_round_end();
        }
        assert!(
            verdicts[0] <= 10 && verdicts[1] == 0,
            "verdicts {verdicts:?}"
        );
    }

    #[test]
    fn losses_sent_before_a_reaction_are_not_judged_again() {
        let t = crate::test_epoch();
        let later = t + Duration::from_millis(50);
        let mut pattern = LossPattern::new();
        pattern.on_ack(t, 10, Some(MIN * 2), MIN, INFLATION);
        pattern.on_ack(t + STANDING, 10, Some(MIN * 2), MIN, INFLATION);
        assert!(pattern.on_loss(&lost([1], t)).is_some());
        pattern.reacted(later);
        pattern.on_ack(later, 10, Some(MIN * 2), MIN, INFLATION);
        pattern.on_ack(later + STANDING, 10, Some(MIN * 2), MIN, INFLATION);
        assert_eq!(pattern.on_loss(&lost([2, 3, 4], t)), None);
        assert!(pattern.on_loss(&lost([9], later)).is_some());
    }
}
