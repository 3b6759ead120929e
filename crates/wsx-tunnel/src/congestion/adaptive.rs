//! The high-speed adaptive controller: Rapid Start, then Optimal Congestion Control.
//!
//! The controller is rate-based. It estimates two properties of the path — the bottleneck rate
//! (the highest delivery rate measured over the last ten rounds) and the minimum RTT — and
//! paces at a gain times the bottleneck rate, with a window of a gain times the
//! bandwidth-delay product as a safety cap on bytes in flight. This is the model of BBR
//! (Cardwell et al., 2016); what differs is how losses are treated.
//!
//! **Rapid Start.** From the first round the pacing rate is 2/ln 2 ≈ 2.885 times the measured
//! delivery rate: the smallest gain that doubles the delivery rate every round, so the rate
//! accelerates smoothly — paced, never a window-sized burst — and reaches a 100 Mbit/s, 100 ms
//! path from a 32-packet start in about five rounds. It ends when the delivery rate stops
//! growing (three rounds without 25 % growth: the pipe is full; rounds in which the sender
//! ran out of data do not count, so a tunnel that idled on keepalives still ramps up) or
//! when losses show a full queue. A short drain at the inverse gain then empties the queue
//! Rapid Start built.
//!
//! **Optimal Congestion Control.** The rate cruises at the bottleneck estimate, and every eight
//! minimum RTTs it probes for more (one RTT at 1.25×) and drains (0.75×) until no more than
//! the bandwidth-delay product (and the line's share of it, see below) is in flight, for at
//! most three RTTs. The drain must run until
//! the queue is gone, not for one RTT: a probe adds as much queue as one RTT of draining
//! removes, so a queue left by anything else (the start-up, a short dip of the bottleneck,
//! an estimate a percent high from ACK timing noise) would otherwise stand for good. In the
//! lab that was a median of 23-33 ms; now it is 1-4 ms. The probe's queue is at most a
//! quarter of the bandwidth-delay product. Two probes in a row that each found 15 % more rate
//! mean the estimate is far below what the path gives (a competing flow left, or a congestion
//! verdict cut too deep): the controller then searches at Rapid Start's pace again.
//!
//! **Minimum RTT.** The smallest RTT sample of the last 10-20 s (two windows), not of the whole
//! connection: a route change to a longer path would otherwise look like a queue that never
//! drains, and every loss like congestion. The probe cycle's drain phase empties the
//! controller's own queue every eight rounds, so the true minimum is sampled within any window.
//!
//! **Losses.** Both phases hand every loss to the loss-pattern classifier (`loss_pattern.rs`).
//! Random losses do not slow the sender, so the controller keeps the link full at 1 % or
//! 5 % loss where a loss-halving controller collapses. The estimate is a delivery rate and
//! counts only what arrived, so the pacing rate is raised by the line's loss rate,
//! `1 / (1 - p)`: otherwise the share the line loses is a share the bottleneck idles where
//! the line drops packets before it (5 % loss without FEC kept 84-85 % of the lab's link
//! instead of 92 %). `p` is measured on the packets sent while draining (told apart by when
//! they were sent), below the bottleneck's rate, so that a queue too short to show a rising
//! RTT, whose overflow looks random, does not make the sender send for its own overflow;
//! and on Rapid Start's rounds that were paced no faster than the bottleneck rate it ended
//! with, so that a new connection whose ramp sent enough below that rate (the 500
//! packets' worth `p` needs; a ramp to 100 Mbit/s at 100 ms does) knows `p` when its
//! first drain ends.
//! Because the pacing rate is raised so, a drain lasts until what is in flight is the
//! bandwidth-delay product and the share of it the line loses (lost packets count in flight
//! until they are declared lost), that share taken a standard error below its estimate: a
//! drain that ended with a queue standing would raise the minimum RTT by it, and the next
//! drain's target with it. Losses FEC repairs are acknowledged and count as arrived.
//! Congestive losses (a full queue, more loss runs than the line's own rate explains, more
//! long runs than the line makes) reset the bottleneck estimate to the most recent delivery
//! rate — the rate the bottleneck actually gave us — and
//! drain for one round, which removes the overflow within about an RTT of its detection. Unlike
//! BBR v1 the controller therefore does yield when the bottleneck shrinks or another flow
//! arrives, instead of holding a ten-round-old maximum.
//!
//! **Warm start.** Given the path hint of an earlier connection to the same peer (or the
//! operator's stated rate, which the connection passes as one), the controller skips Rapid
//! Start and cruises at that rate from the first round; if the path has changed, the loss
//! classifier corrects it as it would any overestimate.
//!
//! **Application-limited samples.** A delivery sample taken while the sender had nothing to
//! send measures the application: it may raise the estimate, never lower it, and it never
//! stands for the path when congestion resets the estimate (that backs off to 70 % instead).
//! Before the first estimate, the initial window per minimum RTT stands for it: the ACK of
//! the handshake's confirming PING once set the estimate to a few bytes a second and the
//! first window to eight packets. That initial rate follows the minimum RTT down, so an
//! initiation that waited for address resolution does not pace the first round.
//! A flight shorter than a round trip (an answer) is also timed where it arrives
//! (`delivery.rs`), so Rapid Start's gain raises the estimate answer by answer towards the
//! path's rate: these rounds never count towards a full pipe, and the estimate keeps what
//! they found.

use super::loss_pattern::{CLUSTER_LEN, Cause, LossPattern};
use super::{
    AckEvent, Controller, ControllerFactory, ControllerState, LossEvent, LossVerdict, PathHint,
    PathParams, bytes_in, rate_of, scale,
};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// 2/ln 2, per mille: the Rapid Start pacing gain.
const RAPID_START_GAIN: u64 = 2885;
/// The inverse of the Rapid Start gain: drains in one round what Rapid Start queued.
const DRAIN_GAIN: u64 = 347;
/// The window in Rapid Start allows the gain's worth of bandwidth-delay product in flight.
const RAPID_START_WINDOW_GAIN: u64 = 2885;
/// In Optimal, twice the bandwidth-delay product may be in flight: enough to keep sending at
/// the full rate while ACKs are coalesced and delayed, and a hard cap if they stop.
const OPTIMAL_WINDOW_GAIN: u64 = 2000;
/// The Optimal pacing cycle, one phase per minimum RTT: probe, drain the probe, cruise.
const CYCLE: [u64; 8] = [1250, 750, 1000, 1000, 1000, 1000, 1000, 1000];
/// Rapid Start ends after this many rounds without this much growth.
const FULL_PIPE_ROUNDS: u32 = 3;
const FULL_PIPE_GROWTH: u64 = 1250;
/// A congestion verdict while the application limits the sender lowers the estimate to this
/// share, per mille (BBRv2's multiplicative decrease): its delivery rate measures only what
/// the application sent.
const APP_LIMITED_BACKOFF: u64 = 700;
/// Rounds over which the bottleneck rate is the maximum delivery rate.
const RATE_WINDOW_ROUNDS: u64 = 10;
/// The smallest RTT rise taken as a full queue, whatever the minimum RTT: below it, jitter.
const MIN_INFLATION: Duration = Duration::from_millis(4);
/// Packets of window always allowed, so that ACKs keep flowing at very low rates.
const MIN_WINDOW_PACKETS: u64 = 4;
/// Optimal cycles in a row whose probe raised the bottleneck estimate by [`PROBE_GROWTH`]
/// after which the controller goes back to Rapid Start: the path has far more room than the
/// estimate (a competing flow left, or a congestion verdict cut the rate too far), and probing
/// at 1.25× per eight rounds would take dozens of round trips to find it.
const GROWING_CYCLES: u32 = 2;
/// A probe at 1.25× into a full pipe only queues (no growth); into free room it delivers
/// about 25 % more. 15 % tells the two apart with room for noise.
const PROBE_GROWTH: u64 = 1150;
/// The longest an Optimal drain phase (0.75×) lasts, in minimum RTTs, when the queue does
/// not empty sooner (another flow keeps it full).
const MAX_DRAIN_ROUNDS: u32 = 3;
/// Packets' worth of bytes sent while draining before their loss rate is the line's (see
/// `line_loss`): 500 put a 5 % loss rate within about a point.
const LINE_LOSS_PACKETS: u64 = 500;
/// Packets' worth of bytes over which the line's loss rate is averaged: older drains' bytes
/// count for less as newer ones come, so that a line that changes is followed. On a path
/// whose drains send fewer than about 150 packets, 32 drains are the memory instead
/// ([`LINE_LOSS_KEEP`]): otherwise one of 13 packets (10 Mbit/s at 20 ms) would follow a
/// change only after some 400 probe cycles.
const LINE_LOSS_MEMORY: u64 = 5000;
/// Rapid Start's last rounds recorded for the line's loss rate (see [`RampRound`]):
/// doubling each round from the first delivery sample, twenty reach any path's rate, and
/// an idle tunnel's rounds (a keepalive each) before the ramp leave the record in turn.
const RAMP_ROUNDS: usize = 32;
/// The most of the line's loss history one drain keeps.
const LINE_LOSS_KEEP: f64 = 0.968_75;
/// The most random loss the pacing rate makes up for (see `for_random_loss`): beyond it
/// the line is broken rather than lossy, and sending a third more is no answer.
const MAX_COMPENSATED_LOSS: f64 = 0.25;
/// How long a minimum RTT stands unless it is seen again. The Optimal cycle empties its own
/// queue every eight rounds, so the path's true minimum is sampled many times per window; a
/// path that got longer (a route change) is believed after one to two windows.
const MIN_RTT_WINDOW: Duration = Duration::from_secs(10);

/// Settings of the [`Adaptive`] controller.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AdaptiveConfig {
    /// Packets the first round may carry.
    pub initial_window_packets: u64,
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        Self {
            initial_window_packets: 32,
        }
    }
}

impl ControllerFactory for AdaptiveConfig {
    fn build(&self, now: Instant, params: &PathParams) -> Box<dyn Controller> {
        Box::new(Adaptive::new(self, now, params))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    RapidStart,
    Drain,
    Optimal,
}

/// See the module documentation.
#[derive(Debug)]
pub struct Adaptive {
    max_datagram: u64,
    phase: Phase,
    bottleneck: WindowedMax,
    /// The minimum RTT over the last one to two [`MIN_RTT_WINDOW`]s.
    min_rtt: Duration,
    /// The smallest RTT sample of the current window, and when that window began.
    window_min_rtt: Duration,
    window_start: Instant,
    /// Round-trip counting: a round ends when a packet sent after it began is acknowledged.
    round: u64,
    next_round_delivered: u64,
    /// The most recent delivery-rate sample the application did not limit (0: none yet),
    /// and whether one it limited came after it.
    latest_rate: u64,
    app_limited_since: bool,
    /// Whether a sample of the current round was limited by the application rather than the
    /// path: such a round says nothing about whether the pipe is full.
    round_app_limited: bool,
    full_rate: u64,
    full_rate_rounds: u32,
    cycle_index: usize,
    cycle_start: Instant,
    /// The bottleneck estimate when the last probe began, and how many cycles in a row it grew.
    probe_base: u64,
    growing_cycles: u32,
    initial_window: u64,
    pacing_rate: u64,
    window: u64,
    /// See [`PathParams::peer_ack_delay`].
    peer_ack_delay: Duration,
    in_flight: u64,
    pattern: LossPattern,
    /// The last drain's packets, until their losses are known (see [`DrainSpan`]).
    drain: Option<DrainSpan>,
    /// Rapid Start's last [`RAMP_ROUNDS`] rounds while it lasts (see [`RampRound`]).
    ramp: VecDeque<RampRound>,
    /// Rapid Start's rounds that sent below the bottleneck rate found at its end, until
    /// their losses are known: a drain's worth of the line's loss, learnt seconds before
    /// the probe cycle's drains have sent enough to tell it.
    ramp_span: Option<DrainSpan>,
    /// When the last ACK frame was taken: the losses it revealed have been reported since.
    last_ack: Instant,
    /// See [`Adaptive::line_loss`]: the bytes drains sent and lost, each decayed over
    /// [`LINE_LOSS_MEMORY`], and all the bytes they sent.
    line_sent: f64,
    line_lost: f64,
    line_bytes: u64,
    /// [`LINE_LOSS_PACKETS`] were seen.
    line_known: bool,
    congestion_events: u64,
    random_losses: u64,
    losses: u64,
}

impl Adaptive {
    pub fn new(config: &AdaptiveConfig, now: Instant, params: &PathParams) -> Self {
        let initial_window =
            config.initial_window_packets.max(MIN_WINDOW_PACKETS) * params.max_datagram;
        let min_rtt = params.initial_rtt.max(Duration::from_micros(100));
        let mut this = Self {
            max_datagram: params.max_datagram,
            peer_ack_delay: params.peer_ack_delay,
            phase: Phase::RapidStart,
            bottleneck: WindowedMax::default(),
            min_rtt,
            window_min_rtt: min_rtt,
            window_start: now,
            round: 0,
            next_round_delivered: 0,
            latest_rate: 0,
            app_limited_since: false,
            round_app_limited: false,
            full_rate: 0,
            full_rate_rounds: 0,
            cycle_index: 2,
            cycle_start: now,
            probe_base: 0,
            growing_cycles: 0,
            initial_window,
            pacing_rate: scale(rate_of(initial_window, min_rtt), RAPID_START_GAIN),
            window: scale(initial_window, RAPID_START_WINDOW_GAIN),
            in_flight: 0,
            pattern: LossPattern::new(),
            drain: None,
            ramp: VecDeque::new(),
            ramp_span: None,
            last_ack: now,
            line_sent: 0.0,
            line_lost: 0.0,
            line_bytes: 0,
            line_known: false,
            congestion_events: 0,
            random_losses: 0,
            losses: 0,
        };
        if let Some(hint) = params.hint {
            this.bottleneck.reset(0, hint.rate);
            this.min_rtt = hint.min_rtt.min(min_rtt);
            this.phase = Phase::Optimal;
            this.update_outputs();
        }
        this
    }

    fn bdp(&self) -> u64 {
        match self.bottleneck.get() {
            0 => self.initial_window,
            rate => bytes_in(rate, self.min_rtt),
        }
    }

    /// What is in flight when the pipe is full and no queue stands: the bandwidth-delay
    /// product and the share of what is sent that the line loses on the way, since a lost
    /// packet counts in flight until it is declared lost, about a round trip after it was
    /// sent; that share at the low end of its estimate ([`Adaptive::line_loss_low`]). A
    /// drain that waited for the bandwidth-delay product alone also emptied the pipe of it:
    /// at 5 % loss each probe cycle's drain idled the bottleneck for about 8 % of a round
    /// trip.
    fn full_pipe(&self) -> u64 {
        raised(self.bdp(), self.line_loss_low())
    }

    /// The rate the controller works from: the bottleneck estimate, or before there is one,
    /// the initial window per minimum RTT. The latter follows the minimum RTT down: the
    /// handshake's sample can stand well above the path's (the initiator's first datagram
    /// waits for address resolution, or for the peer to come up), and the first round
    /// should not be paced by it.
    fn rate(&self) -> u64 {
        match self.bottleneck.get() {
            0 => rate_of(self.initial_window, self.min_rtt),
            rate => rate,
        }
    }

    fn pacing_gain(&self) -> u64 {
        match self.phase {
            Phase::RapidStart => RAPID_START_GAIN,
            Phase::Drain => DRAIN_GAIN,
            Phase::Optimal => CYCLE[self.cycle_index],
        }
    }

    fn update_outputs(&mut self) {
        let rate = self.rate();
        let pacing = self.for_random_loss(scale(rate, self.pacing_gain()));
        // Rapid Start never slows down: early samples can undershoot while the first flights
        // are still being acknowledged.
        self.pacing_rate = if self.phase == Phase::RapidStart {
            self.pacing_rate.max(pacing)
        } else {
            pacing
        };
        let gain = match self.phase {
            Phase::RapidStart | Phase::Drain => RAPID_START_WINDOW_GAIN,
            Phase::Optimal => OPTIMAL_WINDOW_GAIN,
        };
        // Room for what is sent while the peer delays its acknowledgement, on top of the
        // round trip's worth (BBR's allowance for aggregated ACKs, known here in advance).
        let delayed = bytes_in(rate, self.peer_ack_delay);
        self.window = scale(self.bdp(), gain).max(MIN_WINDOW_PACKETS * self.max_datagram)
            + delayed
            + MIN_WINDOW_PACKETS * self.max_datagram;
    }

    fn on_round_start(&mut self, now: Instant) {
        self.pattern.on_round_end();
        let app_limited = std::mem::take(&mut self.round_app_limited);
        // An idle tunnel (keepalive PINGs only) must not conclude that the pipe is full.
        if self.phase == Phase::RapidStart && !app_limited {
            let rate = self.bottleneck.get();
            if rate >= scale(self.full_rate, FULL_PIPE_GROWTH) {
                self.full_rate = rate;
                self.full_rate_rounds = 0;
            } else {
                self.full_rate_rounds += 1;
                if self.full_rate_rounds >= FULL_PIPE_ROUNDS {
                    self.end_rapid_start(now);
                }
            }
        }
    }

    /// Counts a packet (or a burst of parity) of `bytes` sent at `now` in Rapid Start's
    /// current round.
    fn on_ramp_sent(&mut self, now: Instant, bytes: u64) {
        let pacing = self.pacing_rate;
        if let Some(last) = self.ramp.back_mut()
            && last.round == self.round
        {
            last.sent += bytes;
            last.pacing = last.pacing.max(pacing);
            return;
        }
        if self.ramp.len() == RAMP_ROUNDS {
            self.ramp.pop_front();
        }
        self.ramp.push_back(RampRound {
            round: self.round,
            start: now,
            pacing,
            sent: bytes,
            lost: 0,
        });
    }

    /// Leaves Rapid Start for its drain. The rounds that sent no faster than the
    /// bottleneck rate it found queued nothing there, so what they lost the line lost:
    /// they become a span whose losses are folded into the line's loss rate once known, as
    /// a drain's are. At 5 % loss the first probe cycle's drains took two seconds to send
    /// the packets the line's rate needs, while the sender paced at the bottleneck rate
    /// alone and the bottleneck idled for the line's share; a ramp to 100 Mbit/s at 100 ms
    /// sends more than the 500 packets' worth that needs below that rate.
    fn end_rapid_start(&mut self, now: Instant) {
        self.phase = Phase::Drain;
        let rate = self.bottleneck.get();
        let rounds = std::mem::take(&mut self.ramp);
        let below = rounds.iter().take_while(|r| r.pacing <= rate).count();
        let Some(first) = rounds.front().filter(|_| below > 0) else {
            return;
        };
        let end = rounds.get(below).map_or(now, |r| r.start);
        let (sent, lost) = rounds
            .range(..below)
            .fold((0, 0), |(sent, lost), r| (sent + r.sent, lost + r.lost));
        self.ramp_span = Some(DrainSpan {
            start: first.start,
            end: Some(end),
            sent,
            lost,
            spoiled: false,
        });
    }

    /// Counts a packet (or a burst of parity) of `bytes` sent at `now` in the current
    /// drain, starting one when draining begins.
    fn on_drain_sent(&mut self, now: Instant, bytes: u64) {
        let draining = self.pacing_gain() < 1000;
        match &mut self.drain {
            Some(span) if span.end.is_none() => {
                if draining {
                    span.sent += bytes;
                } else {
                    span.end = Some(now);
                }
            }
            _ if draining => {
                // The drain before teaches if its fate is known; if not (a verdict started
                // this one), nothing: a verdict came while it awaited its losses.
                self.learn_line_loss_after(self.last_ack);
                self.drain = Some(DrainSpan {
                    start: now,
                    end: None,
                    sent: bytes,
                    lost: 0,
                    spoiled: false,
                });
            }
            _ => {}
        }
    }

    /// Folds the last drain into the line's loss rate once its packets' fate is known: an
    /// ACK frame taken at `acked`, at least two minimum RTTs and the peer's ACK delay after
    /// the drain ended, has had its losses reported. The recovery tells the controller of an
    /// ACK before the losses it reveals, so the ACK that comes after a long silence must not
    /// fold the drain itself: its losses would be left out.
    fn learn_line_loss_after(&mut self, acked: Instant) {
        let settle = 2 * self.min_rtt + self.peer_ack_delay;
        let settled = |span: &mut DrainSpan| span.end.is_some_and(|end| acked >= end + settle);
        let spans = [self.ramp_span.take_if(settled), self.drain.take_if(settled)];
        for span in spans.into_iter().flatten() {
            if !span.spoiled {
                self.learn_line_loss(span.sent, span.lost);
            }
        }
    }

    /// Folds `lost` of `sent` bytes into the line's loss rate, by bytes: a drain cut short
    /// by the queue's emptying says less than a whole one (the first estimate once came
    /// from 150 packets and stood for seconds against the next drains' 700).
    fn learn_line_loss(&mut self, sent: u64, lost: u64) {
        if sent == 0 {
            return;
        }
        let keep = (-(sent as f64) / (LINE_LOSS_MEMORY * self.max_datagram) as f64)
            .exp()
            .min(LINE_LOSS_KEEP);
        self.line_sent = self.line_sent * keep + sent as f64;
        self.line_lost = self.line_lost * keep + lost.min(sent) as f64;
        self.line_bytes = self.line_bytes.saturating_add(sent);
        // Once known it stays known, whatever the datagram size becomes (path MTU
        // discovery raising it would otherwise move the threshold past what was seen).
        self.line_known |= self.line_bytes >= LINE_LOSS_PACKETS * self.max_datagram;
    }

    fn advance_phase(&mut self, now: Instant) {
        match self.phase {
            Phase::RapidStart => {}
            Phase::Drain => {
                if self.in_flight <= self.full_pipe() {
                    self.phase = Phase::Optimal;
                    self.cycle_index = 2;
                    self.cycle_start = now;
                }
            }
            Phase::Optimal => {
                // A drain phase lasts until the queue is gone (the probe's, and any the
                // estimate's noise built up since the last cycle), within bounds; the
                // others one minimum RTT each.
                let elapsed = now.saturating_duration_since(self.cycle_start);
                let done = if CYCLE[self.cycle_index] < 1000 {
                    self.in_flight <= self.full_pipe() || elapsed >= self.min_rtt * MAX_DRAIN_ROUNDS
                } else {
                    elapsed >= self.min_rtt
                };
                if done {
                    self.cycle_index = (self.cycle_index + 1) % CYCLE.len();
                    self.cycle_start = now;
                    if self.cycle_index == 0 {
                        self.on_probe_start();
                    }
                }
            }
        }
    }

    /// A new Optimal cycle begins with a probe: if the last ones kept finding more rate,
    /// search for the rate at Rapid Start's pace instead.
    fn on_probe_start(&mut self) {
        let rate = self.bottleneck.get();
        let grew = self.probe_base > 0 && rate >= scale(self.probe_base, PROBE_GROWTH);
        self.growing_cycles = if grew { self.growing_cycles + 1 } else { 0 };
        self.probe_base = rate;
        if self.growing_cycles >= GROWING_CYCLES {
            tracing::debug!(rate, "probes keep finding more rate; back to rapid start");
            self.growing_cycles = 0;
            self.phase = Phase::RapidStart;
            self.full_rate = rate;
            self.full_rate_rounds = 0;
        }
    }

    /// Takes an RTT sample into the windowed minimum: a smaller sample counts at once; at
    /// the end of each window the minimum becomes that window's, forgetting older ones.
    fn update_min_rtt(&mut self, now: Instant, sample: Duration) {
        self.min_rtt = self.min_rtt.min(sample);
        self.window_min_rtt = self.window_min_rtt.min(sample);
        if now.saturating_duration_since(self.window_start) >= MIN_RTT_WINDOW {
            self.min_rtt = self.window_min_rtt;
            self.window_min_rtt = sample;
            self.window_start = now;
        }
    }

    /// The line's own loss rate: what was lost and not rebuilt by the peer of the bytes sent
    /// while the pacing gain was below one (a drain, parity included), in drains during
    /// whose wait for their losses no congestion verdict came (a competing flow's queue may
    /// drop even what a drain sends), once [`LINE_LOSS_PACKETS`] full packets' worth have
    /// been seen, weighted by bytes over the last [`LINE_LOSS_MEMORY`] or so. Those packets
    /// were sent below the bottleneck's rate, so their losses are the line's and not an
    /// overflow's. Packets are told apart
    /// by when they were sent, not by round: a drain ends as soon as the queue is gone,
    /// often within the round it began, and rounds that began in one were rare.
    /// The loss classifier's rate would not do: on a bottleneck whose queue is too short to
    /// show a rising RTT, overflow losses look random, and sending for them made more of
    /// them (a 2 ms queue lost 15 % instead of 4-5 %).
    fn line_loss(&self) -> Option<f64> {
        (self.line_known && self.line_sent > 0.0).then(|| self.line_lost / self.line_sent)
    }

    /// The line's loss rate less one standard error of its estimate (on the decayed count
    /// of packets it rests on), never below zero: what a drain may count on the line
    /// losing. Taken at face value, an estimate a point high would end drains with a point
    /// of the bandwidth-delay product still queued, which the minimum RTT would take for
    /// path, and the next drain's target would grow by it.
    fn line_loss_low(&self) -> Option<f64> {
        let p = self.line_loss()?;
        let packets = self.line_sent / self.max_datagram.max(1) as f64;
        Some((p - (p * (1.0 - p) / packets).sqrt()).max(0.0))
    }

    /// `rate` raised by the line's random-loss rate: the estimate counts what arrived, and
    /// to have that arrive the sender must also send what the line loses on the way. Where
    /// the line loses packets before the bottleneck (the estimate is then the bottleneck's
    /// rate), the bottleneck would otherwise idle for that share; where it loses them after
    /// (the estimate is the bottleneck's rate less the losses), this is the bottleneck's
    /// rate. Losses FEC repaired are acknowledged, so they count as arrived and not here.
    fn for_random_loss(&self, rate: u64) -> u64 {
        raised(rate, self.line_loss())
    }

    /// The RTT rise that marks a full queue. In Optimal, a probe may legitimately queue a
    /// quarter of the minimum RTT, so only more than half of it counts there.
    fn inflation(&self) -> Duration {
        let share = match self.phase {
            Phase::RapidStart | Phase::Drain => self.min_rtt / 4,
            Phase::Optimal => self.min_rtt / 2,
        };
        share.max(MIN_INFLATION)
    }
}

impl Controller for Adaptive {
    fn on_sent(&mut self, now: Instant, bytes: u64, in_flight: u64) {
        self.in_flight = in_flight;
        // From the first delivery sample: before it (a new connection's first round, the
        // probes after persistent congestion) nothing says the path carries what is sent.
        if self.phase == Phase::RapidStart && self.bottleneck.get() > 0 {
            self.on_ramp_sent(now, bytes);
        }
        self.on_drain_sent(now, bytes);
    }

    fn on_ack(&mut self, now: Instant, ack: &AckEvent<'_>) {
        // The last ACK's losses are in now; this one's come after this call.
        self.learn_line_loss_after(self.last_ack);
        self.last_ack = now;
        self.in_flight = ack.in_flight;
        if let Some(sample) = ack.rtt_sample {
            self.update_min_rtt(now, sample);
        }
        let inflation = self.inflation();
        self.pattern.on_ack(
            now,
            ack.acked_packets,
            ack.rtt_sample,
            self.min_rtt,
            inflation,
        );
        if ack.prior_delivered >= self.next_round_delivered {
            self.round += 1;
            self.next_round_delivered = ack.delivered;
            self.on_round_start(now);
        }
        if let Some(sample) = ack.rate {
            // A sample the application limited measures the application: it may raise the
            // estimate, never lower it (nor stand for the path after a congestion verdict).
            // Before the first estimate, the estimate is the initial rate: the ACK of the
            // handshake's confirming PING must not shrink the first window to a few packets.
            if sample.app_limited {
                self.app_limited_since = true;
            } else {
                self.latest_rate = sample.rate;
                self.app_limited_since = false;
            }
            self.round_app_limited |= sample.app_limited;
            if !sample.app_limited || sample.rate >= self.rate() {
                self.bottleneck.update(self.round, sample.rate);
            }
        }
        self.advance_phase(now);
        self.update_outputs();
    }

    fn on_loss(&mut self, now: Instant, loss: &LossEvent<'_>) -> LossVerdict {
        self.losses += loss.lost.len() as u64;
        self.in_flight = loss.in_flight;
        let verdict = self.pattern.on_loss(loss.lost);
        for p in loss.lost.iter().filter(|p| !p.repaired) {
            for span in [&mut self.drain, &mut self.ramp_span].into_iter().flatten() {
                if span.holds(p.sent) {
                    span.lost += p.bytes;
                }
            }
            if let Some(round) = self.ramp.iter_mut().rev().find(|r| r.start <= p.sent) {
                round.lost += p.bytes;
            }
        }
        if let Some(span) = &mut self.drain {
            // Any reaction while the drain awaits its losses: some of them may be the
            // overflow's, judged with other packets or not judged again after it.
            span.spoiled |= verdict.is_some();
        }
        match verdict {
            None => {
                self.random_losses += loss.lost.len() as u64;
                LossVerdict::Random
            }
            Some(cause) => {
                self.congestion_events += 1;
                self.pattern.reacted(now);
                tracing::debug!(
                    ?cause,
                    phase = ?self.phase,
                    rate = self.latest_rate,
                    min_rtt = ?self.min_rtt,
                    "congestion"
                );
                match self.phase {
                    Phase::RapidStart => self.end_rapid_start(now),
                    Phase::Drain | Phase::Optimal => {
                        // What the bottleneck last gave a sender with data to send; if the
                        // application has held the sender back since, that says nothing
                        // of the path, and the estimate comes down by a fixed factor.
                        // Before a first estimate, the initial rate stands for it.
                        let estimate = self.rate();
                        let rate = match self.latest_rate {
                            _ if self.app_limited_since => scale(estimate, APP_LIMITED_BACKOFF),
                            0 => estimate,
                            r => r.min(estimate),
                        };
                        self.bottleneck.reset(self.round, rate);
                        self.phase = Phase::Optimal;
                        // Drain the overflow for one round, then cruise.
                        self.cycle_index = 1;
                        self.cycle_start = now;
                    }
                }
                // Rapid Start's rounds below the bottleneck rate queued nothing there, so the
                // verdict that ends it is on the rounds after them; one that judged a run's
                // worth of their own losses says they met a queue after all.
                if let Some(span) = &mut self.ramp_span {
                    let own = loss.lost.iter().filter(|p| span.holds(p.sent)).count();
                    span.spoiled |= own as u64 >= CLUSTER_LEN;
                }
                self.update_outputs();
                match cause {
                    Cause::Inflation => LossVerdict::Overflow,
                    Cause::Excess | Cause::Cluster => LossVerdict::Congestion,
                }
            }
        }
    }

    fn on_persistent_congestion(&mut self, now: Instant) {
        for span in [&mut self.drain, &mut self.ramp_span].into_iter().flatten() {
            span.spoiled = true;
        }
        self.ramp.clear();
        // Nothing got through for several RTTs: what was learned may be wrong. Start over.
        self.bottleneck = WindowedMax::default();
        self.phase = Phase::RapidStart;
        self.full_rate = 0;
        self.full_rate_rounds = 0;
        self.pacing_rate = 0;
        self.pattern.reacted(now);
        self.update_outputs();
    }

    fn window(&self) -> u64 {
        self.window
    }

    fn pacing_rate(&self) -> u64 {
        self.pacing_rate
    }

    fn state(&self) -> ControllerState {
        ControllerState {
            phase: match self.phase {
                Phase::RapidStart => "rapid-start",
                Phase::Drain => "drain",
                Phase::Optimal => "optimal",
            },
            window: self.window,
            pacing_rate: self.pacing_rate,
            bottleneck_rate: self.bottleneck.get(),
            min_rtt: self.min_rtt,
            congestion_events: self.congestion_events,
            random_losses: self.random_losses,
            losses: self.losses,
        }
    }

    fn on_max_datagram(&mut self, max_datagram: u64) {
        self.max_datagram = max_datagram;
    }

    fn path_hint(&self) -> Option<PathHint> {
        (self.phase == Phase::Optimal && self.bottleneck.get() > 0).then(|| PathHint {
            rate: self.bottleneck.get(),
            min_rtt: self.min_rtt,
        })
    }
}

/// `value` over `1 - loss`: what must be sent for `value` to arrive where the line loses
/// `loss` of it (at most [`MAX_COMPENSATED_LOSS`]).
fn raised(value: u64, loss: Option<f64>) -> u64 {
    match loss {
        Some(loss) if loss > 0.0 => {
            (value as f64 / (1.0 - loss.min(MAX_COMPENSATED_LOSS))).round() as u64
        }
        _ => value,
    }
}

/// The bytes sent during one drain (the pacing gain below one) and what of them was lost.
#[derive(Debug, Clone, Copy)]
struct DrainSpan {
    start: Instant,
    /// When the drain ended (`None`: still draining).
    end: Option<Instant>,
    sent: u64,
    /// Lost and not rebuilt by the peer.
    lost: u64,
    /// A congestion verdict came while it awaited its losses: some may be an overflow's.
    spoiled: bool,
}

/// One of Rapid Start's rounds: when it began, the highest pacing rate it sent at, what it
/// sent and what of that was lost (and not rebuilt by the peer).
#[derive(Debug, Clone, Copy)]
struct RampRound {
    round: u64,
    start: Instant,
    pacing: u64,
    sent: u64,
    lost: u64,
}

impl DrainSpan {
    fn holds(&self, sent: Instant) -> bool {
        sent >= self.start && self.end.is_none_or(|end| sent < end)
    }
}

/// The maximum of per-round values over the last [`RATE_WINDOW_ROUNDS`] rounds.
#[derive(Debug, Default, Clone)]
struct WindowedMax {
    /// (round, maximum in that round), indexed by round modulo the window.
    slots: [(u64, u64); RATE_WINDOW_ROUNDS as usize],
    newest: u64,
}

impl WindowedMax {
    fn update(&mut self, round: u64, value: u64) {
        let slot = &mut self.slots[(round % RATE_WINDOW_ROUNDS) as usize];
        if slot.0 != round {
            *slot = (round, value);
        } else {
            slot.1 = slot.1.max(value);
        }
        self.newest = round;
    }

    fn reset(&mut self, round: u64, value: u64) {
        self.slots = Default::default();
        self.update(round, value);
    }

    fn get(&self) -> u64 {
        self.slots
            .iter()
            .filter(|(round, _)| round + RATE_WINDOW_ROUNDS > self.newest)
            .map(|&(_, value)| value)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::super::LostPacket;
    use super::super::tests::lost;
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A cold controller for 1,400-byte datagrams whose handshake measured `initial_rtt`.
    fn cold(start: Instant, initial_rtt: Duration) -> Adaptive {
        let params = PathParams {
            max_datagram: 1400,
            initial_rtt,
            peer_ack_delay: 25 * MS,
            hint: None,
        };
        Adaptive::new(&AdaptiveConfig::default(), start, &params)
    }

    #[test]
    fn the_minimum_rtt_forgets_samples_older_than_two_windows() {
        let start = crate::test_epoch();
        let mut c = cold(start, 50 * MS);
        let second = Duration::from_secs(1);
        // 50 ms for 5 s, then the route gets longer: 150 ms.
        for t in 0..5 {
            c.update_min_rtt(start + t * second, 50 * MS);
        }
        for t in 5..40 {
            c.update_min_rtt(start + t * second, 150 * MS);
            let expected = if t < 20 { 50 * MS } else { 150 * MS };
            assert_eq!(c.min_rtt, expected, "{t} s");
        }
        // A shorter path counts at once.
        c.update_min_rtt(start + 40 * second, 30 * MS);
        assert_eq!(c.min_rtt, 30 * MS);
    }

    /// Before the first estimate, a trickle's sample (the ACK of the handshake's PING) leaves
    /// the first window and pacing rate as they were, and a smaller RTT than the handshake's
    /// raises the initial pacing rate.
    #[test]
    fn the_first_window_is_not_set_by_a_trickle() {
        let start = crate::test_epoch();
        let mut c = cold(start, 150 * MS);
        let (window, pacing) = (c.window(), c.pacing_rate());
        assert!(window > 32 * 1400 * 2, "window {window}");
        let rtt = crate::rtt::RttEstimator::new(100 * MS);
        let ack = AckEvent {
            acked_bytes: 40,
            acked_packets: 1,
            in_flight: 0,
            rtt: &rtt,
            rtt_sample: Some(100 * MS),
            rate: Some(super::super::RateSample {
                rate: 400,
                interval: 100 * MS,
                app_limited: true,
            }),
            prior_delivered: 0,
            delivered: 40,
        };
        c.on_ack(start + 150 * MS, &ack);
        assert_eq!(c.bottleneck.get(), 0);
        assert!(c.window() >= window, "{} < {window}", c.window());
        // 32 packets per 100 ms instead of per 150 ms.
        let expected = scale(rate_of(32 * 1400, 100 * MS), RAPID_START_GAIN);
        assert_eq!(c.pacing_rate(), expected);
        assert!(c.pacing_rate() > pacing);
    }

    /// A controller for 1,400-byte datagrams that knows the path: 12.5 MB/s, 100 ms.
    fn warm(start: Instant) -> Adaptive {
        let params = PathParams {
            max_datagram: 1400,
            initial_rtt: 100 * MS,
            peer_ack_delay: 25 * MS,
            hint: Some(PathHint {
                rate: 12_500_000,
                min_rtt: 100 * MS,
            }),
        };
        Adaptive::new(&AdaptiveConfig::default(), start, &params)
    }

    /// The verdict on `lost`.
    fn on_loss(c: &mut Adaptive, now: Instant, lost: &[LostPacket]) -> LossVerdict {
        let rtt = crate::rtt::RttEstimator::new(100 * MS);
        let loss = LossEvent {
            lost,
            in_flight: 0,
            rtt: &rtt,
        };
        c.on_loss(now, &loss)
    }

    /// An ACK of one packet with a delivery sample of `rate`.
    fn on_ack(c: &mut Adaptive, now: Instant, rate: u64, app_limited: bool) {
        on_ack_of(c, now, 1, &mut 0, rate, app_limited);
    }

    /// An ACK of `packets` of 1,400 bytes, a 100 ms RTT sample and a delivery sample of
    /// `rate`, with `delivered` the bytes delivered before it (counted on).
    fn on_ack_of(
        c: &mut Adaptive,
        now: Instant,
        packets: u64,
        delivered: &mut u64,
        rate: u64,
        app_limited: bool,
    ) {
        let rtt = crate::rtt::RttEstimator::new(100 * MS);
        let prior_delivered = *delivered;
        *delivered += packets * 1400;
        let ack = AckEvent {
            acked_bytes: packets * 1400,
            acked_packets: packets,
            in_flight: 0,
            rtt: &rtt,
            rtt_sample: Some(100 * MS),
            rate: Some(super::super::RateSample {
                rate,
                interval: 100 * MS,
                app_limited,
            }),
            prior_delivered,
            delivered: *delivered,
        };
        c.on_ack(now, &ack);
    }

    /// A controller that knows the path (12.5 MB/s), given one delivery sample at `sampled`
    /// (`app_limited` or not), then two runs of three lost packets in one round (clustered
    /// loss: congestion): its bottleneck estimate after the verdict.
    fn estimate_after_congestion(sampled: u64, app_limited: bool) -> u64 {
        let start = crate::test_epoch();
        let mut c = warm(start);
        let now = start + 100 * MS;
        on_ack(&mut c, now, sampled, app_limited);
        assert_eq!(
            c.bottleneck.get(),
            12_500_000,
            "a lower sample does not lower it"
        );
        let verdict = on_loss(&mut c, now + MS, &lost([10, 11, 12, 20, 21, 22], now));
        assert_ne!(verdict, LossVerdict::Random);
        c.bottleneck.get()
    }

    /// A drain of 1,000 packets that ends within 11 ms (inside one round, as the probe
    /// cycle's drains do), of which 50 are lost (`lost` gives their numbers) and 10 of those
    /// rebuilt by the peer, and `later` lost of those sent after it: the line's loss rate
    /// once the drain's fate is known.
    fn line_loss_after_a_drain(numbers: &[u64], later: &[u64]) -> Option<f64> {
        let start = crate::test_epoch();
        let mut c = warm(start);
        c.cycle_index = 1;
        let us = Duration::from_micros(1);
        for i in 0..1000 {
            c.on_sent(start + i * 10 * us, 1400, 0);
        }
        c.cycle_index = 2;
        c.on_sent(start + 11 * MS, 1400, 0);
        let mut losses = lost(numbers.iter().copied(), start + 5 * MS);
        for p in &mut losses[..10] {
            p.repaired = true;
        }
        // Before the losses are in, and long after the drain: the packet sent after it is
        // not the drain's.
        let late = lost([5000], start + 11 * MS);
        assert_eq!(
            on_loss(&mut c, start + 120 * MS, &late),
            LossVerdict::Random
        );
        on_loss(
            &mut c,
            start + 125 * MS,
            &lost(later.iter().copied(), start + 20 * MS),
        );
        on_ack(&mut c, start + 200 * MS, 12_500_000, false);
        // The first ACK after a silence past the drain's settling time (2 RTT and the ACK
        // delay: 236 ms) reveals its losses, reported after the ACK itself.
        on_ack(&mut c, start + 240 * MS, 12_500_000, false);
        assert_eq!(
            c.line_loss(),
            None,
            "learned before the drain's losses were all known"
        );
        on_loss(&mut c, start + 240 * MS, &losses);
        on_ack(&mut c, start + 250 * MS, 12_500_000, false);
        c.line_loss()
    }

    /// A cold controller through Rapid Start: rounds of 160 packets of which 6 are lost at
    /// random (one round each per delivery sample: none yet, 0.5, 1, 2 and 4 MB/s, all
    /// paced below the 12.5 MB/s found at the end), then two that overshoot (8 and 12.5
    /// MB/s samples), whose losses come in two runs of 20: congestion, the end of Rapid
    /// Start.
    /// `late` are lost packets of the ramp's second round (the first after a delivery
    /// sample, where the record begins) that are reported with that run.
    /// The line's loss rate once the ramp's losses are known.
    fn line_loss_after_rapid_start(late: &[u64]) -> Option<f64> {
        let start = crate::test_epoch();
        let mut c = cold(start, 100 * MS);
        let us = Duration::from_micros(1);
        let ack = |c: &mut Adaptive, now: Instant, delivered: &mut u64, rate: u64| {
            on_ack_of(c, now, 154, delivered, rate, false);
        };
        let mut delivered = 0;
        let rates = [
            0, 500_000, 1_000_000, 2_000_000, 4_000_000, 8_000_000, 12_500_000,
        ];
        for (k, &rate) in (0u64..).zip(&rates) {
            let round = start + k as u32 * 100 * MS;
            if rate > 0 {
                ack(&mut c, round, &mut delivered, rate);
                // The last round's losses, one in 27 at random.
                let last = round - 100 * MS + MS;
                let numbers = (0..6).map(|i| (k - 1) * 160 + 1 + i * 27);
                if k < 6 {
                    assert_eq!(
                        on_loss(&mut c, round, &lost(numbers, last)),
                        LossVerdict::Random
                    );
                }
            }
            assert_eq!(c.phase, Phase::RapidStart);
            for i in 0..160 {
                c.on_sent(round + MS + i * 100 * us, 1400, 0);
            }
        }
        // The overshooting rounds' run, and the ramp's late losses with it.
        let overshoot = start + 501 * MS;
        let mut losses = lost(late.iter().copied(), start + 101 * MS);
        losses.extend(lost((800..820).chain(830..850), overshoot));
        let verdict = on_loss(&mut c, start + 700 * MS, &losses);
        assert_ne!(verdict, LossVerdict::Random);
        assert_eq!(c.phase, Phase::Drain);
        // The ramp's packets settle 2 RTT and the ACK delay after the last of them was
        // sent (500 ms): known with the first ACK after 725 ms.
        ack(&mut c, start + 720 * MS, &mut delivered, 12_500_000);
        ack(&mut c, start + 730 * MS, &mut delivered, 12_500_000);
        assert_eq!(
            c.line_loss(),
            None,
            "learned before the ramp's losses were known"
        );
        ack(&mut c, start + 740 * MS, &mut delivered, 12_500_000);
        c.line_loss()
    }

    #[test]
    fn the_line_loss_is_learned_from_rapid_start_below_the_bottleneck() {
        // 24 of 640 (the fifth round's losses came with its ACK after it ended): the round
        // before any delivery sample is not recorded, the two rounds paced above 12.5 MB/s
        // are left out.
        let learned = line_loss_after_rapid_start(&[]).expect("a line loss rate");
        assert!((learned - 24.0 / 640.0).abs() < 1e-9, "{learned}");
        // A late loss of the ramp's, reported with the overflow: still the line's.
        let learned = line_loss_after_rapid_start(&[300]).expect("a line loss rate");
        assert!((learned - 25.0 / 640.0).abs() < 1e-9, "{learned}");
        // A congestion verdict on the ramp's own packets: they met a queue after all.
        assert_eq!(line_loss_after_rapid_start(&[300, 301, 302, 303]), None);
    }

    #[test]
    fn the_line_loss_is_learned_from_what_drains_send() {
        let scattered: Vec<u64> = (0..50).map(|i| i * 20).collect();
        let learned = line_loss_after_a_drain(&scattered, &[]).expect("a line loss rate");
        assert!((learned - 0.04).abs() < 1e-9, "{learned}");
        // Two runs of three among them: congestion, so the drain met a queue after all.
        let mut clustered = scattered.clone();
        clustered[40..46].copy_from_slice(&[900, 901, 902, 950, 951, 952]);
        assert_eq!(line_loss_after_a_drain(&clustered, &[]), None);
        // Congestion among packets sent after the drain, while its losses were awaited:
        // the overflow may have taken some of the drain's too.
        let after = [6000, 6001, 6002, 6100, 6101, 6102];
        assert_eq!(line_loss_after_a_drain(&scattered, &after), None);
    }

    #[test]
    fn the_line_loss_weighs_drains_by_their_bytes() {
        let start = crate::test_epoch();
        let mut c = warm(start);
        let packet = c.max_datagram;
        c.learn_line_loss(400 * packet, 20 * packet);
        c.learn_line_loss(99 * packet, 5 * packet);
        assert_eq!(c.line_loss(), None, "499 packets are too few");
        c.learn_line_loss(packet, 0);
        assert!(c.line_loss().is_some(), "500 are enough");
        let mut c = warm(start);
        c.learn_line_loss(400 * packet, 20 * packet);
        c.learn_line_loss(300 * packet, 30 * packet);
        // By bytes, the older drain decayed by e^(-300/5000): 48.8 of 676.7 packets. Per
        // drain it would have been 5.6 %.
        let p = c.line_loss().expect("a rate");
        assert!((p - 0.072_17).abs() < 1e-4, "{p}");
        // A drain of ten packets cut short by the emptied queue, four of them lost, moves
        // it half a point (per drain, an eighth of the way to 40 %: 11.3 %).
        c.learn_line_loss(10 * packet, 4 * packet);
        let p = c.line_loss().expect("a rate");
        assert!((p - 0.077_09).abs() < 1e-4, "{p}");
        // Twenty drains of 700 packets later the line is what they saw (1 %): the older
        // drains keep e^(-2.8) of their weight. Without decay it would read 1.32 %.
        for _ in 0..20 {
            c.learn_line_loss(700 * packet, 7 * packet);
        }
        let p = c.line_loss().expect("a rate");
        assert!((p - 0.010_54).abs() < 1e-4, "{p}");
        // Path MTU discovery raising the datagram size does not forget it.
        c.on_max_datagram(9000);
        assert!(c.line_loss().is_some());
    }

    /// A probe cycle's drain ends when the bandwidth-delay product and the line's share of
    /// it are in flight: 5 % loss learned from 7,000 packets, less one standard error
    /// (4.66 %, on 4,037 decayed packets), raises 1.25 MB to 1,311,058 bytes.
    #[test]
    fn a_drain_ends_with_the_line_share_of_the_pipe_in_flight() {
        let start = crate::test_epoch();
        let drain_ends = |learned: bool, in_flight: u64| {
            let mut c = warm(start);
            if learned {
                for _ in 0..10 {
                    c.learn_line_loss(700 * 1400, 35 * 1400);
                }
            }
            c.cycle_index = 1;
            c.cycle_start = start;
            c.in_flight = in_flight;
            c.advance_phase(start + 10 * MS);
            c.cycle_index == 2
        };
        assert!(drain_ends(false, 1_250_000));
        assert!(!drain_ends(false, 1_290_000));
        assert!(drain_ends(true, 1_290_000));
        assert!(drain_ends(true, 1_311_000));
        assert!(
            !drain_ends(true, 1_312_000),
            "the estimate itself (5 %) is not counted on"
        );
    }

    #[test]
    fn congestion_while_the_application_limits_backs_off_by_a_factor() {
        // The path's own rate, measured: congestion resets the estimate to it.
        assert_eq!(estimate_after_congestion(10_000_000, false), 10_000_000);
        // A trickle's rate says nothing of the path: 70 % of the estimate, not 500 kB/s.
        assert_eq!(estimate_after_congestion(500_000, true), 8_750_000);
    }
}
