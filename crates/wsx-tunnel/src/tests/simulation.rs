//! The tunnel under loss, delay, reordering and many streams. Figures are goodput: stream
//! bytes the receiving application read, against the bottleneck rate in UDP payload bytes.

use crate::testing::{LinkConfig, Pair, Transfers};
use crate::{Connection, ConnectionError, Event, FecMode, StreamMeta, TransportConfig};
use proptest::prelude::*;
use std::time::{Duration, Instant};

const MS: Duration = Duration::from_millis(1);
const RTT: Duration = Duration::from_millis(100);
/// 100 Mbit/s in bytes per second.
const RATE: u64 = 12_500_000;

/// A pair over `forward` (and a clean reverse path of the same RTT), connected.
fn pair(forward: LinkConfig, seed: u64) -> Pair {
    pair_with(forward, seed, crate::testing::transport_config())
}

/// [`pair`] with other transport settings.
pub(super) fn pair_with(forward: LinkConfig, seed: u64, config: TransportConfig) -> Pair {
    let reverse = LinkConfig::new(forward.delay * 2, 1000);
    let mut pair = Pair::with_config(crate::test_epoch(), forward, reverse, seed, config);
    pair.connect();
    pair
}

/// One bulk stream from the client to the server that outlasts any test.
fn endless_stream(pair: &mut Pair) -> Transfers {
    let mut transfers = Transfers::new(0);
    transfers.start(pair, 1 << 40);
    transfers
}

/// Runs for `duration` with `transfers` pumped; the transfers must outlast it.
pub(super) fn run_for(pair: &mut Pair, transfers: &mut Transfers, duration: Duration) {
    let end = pair.now + duration;
    pair.run_until(duration + MS, |pair| {
        transfers.pump(pair);
        pair.now >= end
    });
}

/// Goodput over the buckets `from..to` of the receiver's 100 ms buckets, as a fraction of
/// `rate`. Buckets after the last delivery (not there yet) count as empty.
fn utilization(transfers: &Transfers, from: usize, to: usize, rate: u64) -> f64 {
    let bytes: u64 = transfers.delivered.iter().take(to).skip(from).sum();
    let seconds = (to - from) as f64 * transfers.bucket.as_secs_f64();
    bytes as f64 / (rate as f64 * seconds)
}

/// Goodput of one bulk stream from 3 s to 20 s after the first byte.
fn steady_utilization(loss: f64, seed: u64) -> (f64, Pair) {
    let mut pair = pair(LinkConfig::new(RTT, 100).with_loss(loss), seed);
    let mut transfers = endless_stream(&mut pair);
    run_for(&mut pair, &mut transfers, Duration::from_secs(21));
    (utilization(&transfers, 30, 200, RATE), pair)
}

#[test]
fn one_stream_uses_at_least_95_percent_of_a_clean_path() {
    let (u, mut pair) = steady_utilization(0.0, 1);
    let stats = pair.client().stats();
    assert!(u >= 0.95, "utilization {u:.4}: {stats:#?}");
}

#[test]
fn one_percent_random_loss_keeps_90_percent() {
    let (u, mut pair) = steady_utilization(0.01, 2);
    let stats = pair.client().stats();
    assert!(u >= 0.90, "utilization {u:.4}: {stats:#?}");
}

#[test]
fn five_percent_random_loss_keeps_80_percent() {
    let (u, mut pair) = steady_utilization(0.05, 3);
    let stats = pair.client().stats();
    assert!(u >= 0.80, "utilization {u:.4}: {stats:#?}");
}

/// Without FEC, the pacing rate makes up for what the line loses at random: the estimate
/// counts only what arrived, and the losses here take their share of the bottleneck before
/// the line drops them. Paced at the estimate alone, 5 % loss kept 87.4-87.8 % (seeds 1 and
/// 2); the ideal is 95 % less the packets' overhead.
#[test]
fn without_fec_five_percent_random_loss_keeps_90_percent() {
    let config = TransportConfig {
        fec: FecMode::Off,
        ..crate::testing::transport_config()
    };
    for seed in [1, 2] {
        let mut pair = pair_with(
            LinkConfig::new(RTT, 100).with_loss(0.05),
            seed,
            config.clone(),
        );
        let mut transfers = endless_stream(&mut pair);
        run_for(&mut pair, &mut transfers, Duration::from_secs(21));
        let u = utilization(&transfers, 30, 200, RATE);
        assert!(u >= 0.90, "seed {seed}: utilization {u:.4}");
    }
}

/// Where the line loses packets before the bottleneck (as netem and the lab's emulator
/// do), the bottleneck serializes only what survived: a sender paced at its delivery rate
/// leaves the line's loss rate of it idle, 5 % here. The pacing rate makes up for the loss
/// measured on what drains send, and a drain ends when what is in flight is the pipe's
/// worth and the share of it the line loses (lost packets count in flight until declared
/// lost). Measured (seeds 1-3): the bottleneck busy 96.9-97.4 % of the 21 s, goodput
/// 96.4-97.1 % at steady state; when a drain waited for the bandwidth-delay product alone,
/// busy 96.0 % and goodput 95.6 % (seed 1: the bottleneck idled for about 8 % of a round
/// trip per probe cycle); paced at the estimate alone, goodput 91.1 % (seed 1). Since a
/// queue must stand 4 ms to count (`loss_pattern.rs`), seeds 1-12 keep 95.45-97.2 % at
/// steady state (seed 3: 95.45, where it took 96.0 before, and seed 10 97.0 against
/// 96.1: the start's verdict comes a few packets later and the runs part ways).
#[test]
fn five_percent_loss_before_the_bottleneck_keeps_it_busy() {
    for seed in 1..4 {
        let mut link = LinkConfig::new(RTT, 100).with_loss(0.05);
        link.loss_before_queue = true;
        let mut pair = pair(link, seed);
        let mut transfers = endless_stream(&mut pair);
        run_for(&mut pair, &mut transfers, Duration::from_secs(21));
        let u = utilization(&transfers, 30, 200, RATE);
        let busy = pair.link_stats(0).delivered_bytes as f64 / (RATE as f64 * 21.0);
        assert!(
            busy >= 0.965 && u >= 0.954,
            "seed {seed}: utilization {u:.4}, bottleneck busy {busy:.4}"
        );
    }
}

/// The tunnel's own reliability costs few reverse packets: at steady state at most one per
/// twenty forward data packets (TCP sends one per two).
#[test]
fn reverse_packets_are_at_most_one_per_twenty_data_packets() {
    for loss in [0.0, 0.01] {
        let mut pair = pair(LinkConfig::new(RTT, 100).with_loss(loss), 4);
        let mut transfers = endless_stream(&mut pair);
        run_for(&mut pair, &mut transfers, Duration::from_secs(3));
        let forward = pair.client().stats().eliciting_sent;
        let reverse = pair.server().stats().packets_sent;
        run_for(&mut pair, &mut transfers, Duration::from_secs(10));
        let forward = pair.client().stats().eliciting_sent - forward;
        let reverse = pair.server().stats().packets_sent - reverse;
        assert!(
            reverse * 20 <= forward,
            "loss {loss}: {reverse} reverse packets for {forward} forward"
        );
    }
}

/// The first receiver bucket (buckets are one RTT, 100 ms, long) in which goodput reached 90 %
/// of the bottleneck.
fn first_rtt_at_90_percent(transfers: &Transfers) -> usize {
    first_bucket_at(transfers, 0.9).expect("never reached 90 %")
}

/// The first of the receiver's 100 ms buckets that carried `share` of the bottleneck.
fn first_bucket_at(transfers: &Transfers, share: f64) -> Option<usize> {
    transfers
        .delivered
        .iter()
        .position(|&b| b as f64 >= share * RATE as f64 * 0.1)
}

/// A lossy start is not taken for a full queue. While only a few packets are in flight the
/// receiver holds its ACKs up to `max_ack_delay` (25 ms, a quarter of this RTT), so raw RTT
/// samples stand that much above the floor; a random loss in such a round once ended Rapid
/// Start at a fraction of a Mbit/s, and Optimal took some twenty seconds to probe its way
/// up (the gateways' "intermittent slow start" at 1 and 5 % loss).
#[test]
fn random_loss_at_the_start_does_not_end_rapid_start() {
    // As in the gateways: the tunnel idles on keepalive PINGs (each one ACKed only after
    // max_ack_delay) before the first session arrives.
    let config = TransportConfig {
        keepalive: Duration::from_millis(500),
        ..TransportConfig::default()
    };
    for seed in 0..12 {
        for loss in [0.01, 0.05] {
            let link = LinkConfig::new(RTT, 100).with_loss(loss);
            let mut pair = pair_with(link, 100 + seed, config.clone());
            let idle_until = pair.now + Duration::from_secs(3);
            pair.run_until(Duration::from_secs(4), |pair| pair.now >= idle_until);
            let mut transfers = endless_stream(&mut pair);
            run_for(&mut pair, &mut transfers, Duration::from_secs(4));
            let first = first_bucket_at(&transfers, 0.8);
            assert!(
                first.is_some_and(|f| f < 20),
                "seed {seed}, loss {loss}: first bucket at 80 %: {first:?}: {:?}",
                &transfers.delivered[..20.min(transfers.delivered.len())]
            );
        }
    }
}

/// A receiver held off the CPU for a moment acknowledges late: a late ACK is not a queue.
/// The reverse path stalls for 40 ms at one ACK in fifty, as a gateway's would on a host
/// whose CPU is often taken from it; with a random loss in the same round, one such sample
/// once ended Rapid Start at a fraction of the path's rate (in the lab at 5 % loss, 1-20 %
/// of it in half of the runs on such a machine). Without the 4 ms a queue must stand,
/// seed 0 already fails.
#[test]
fn late_acks_do_not_end_rapid_start() {
    for seed in 0..8 {
        let mut forward = LinkConfig::new(RTT, 100).with_loss(0.05);
        forward.loss_before_queue = true;
        let reverse = LinkConfig {
            stall: Some((0.02, 40 * MS)),
            ..LinkConfig::new(RTT, 1000)
        };
        let config = crate::testing::transport_config();
        let mut pair = Pair::with_config(crate::test_epoch(), forward, reverse, 200 + seed, config);
        pair.connect();
        let mut transfers = endless_stream(&mut pair);
        run_for(&mut pair, &mut transfers, Duration::from_secs(3));
        let first = first_bucket_at(&transfers, 0.8);
        assert!(
            first.is_some_and(|f| f < 20),
            "seed {seed}: first bucket at 80 %: {first:?}: {:?} {:?}",
            &transfers.delivered[..20.min(transfers.delivered.len())],
            pair.client().stats().congestion
        );
    }
}

/// What each side's application offers in the handshake, the other reads back; the
/// tunnel's own extensions are unaffected.
#[test]
fn each_side_reads_the_application_extensions_the_other_offered() {
    let config = TransportConfig {
        app_extensions: 0x8000_0001,
        ..crate::testing::transport_config()
    };
    let pair = pair_with(LinkConfig::new(RTT, 100), 3, config);
    for side in &pair.sides {
        let connection = side.connections.values().next().expect("connected");
        assert!(connection.is_established());
        assert_eq!(connection.peer_app_extensions(), 0x8000_0001);
    }
    let plain = pair_with(
        LinkConfig::new(RTT, 100),
        3,
        crate::testing::transport_config(),
    );
    for side in &plain.sides {
        let connection = side.connections.values().next().expect("connected");
        assert_eq!(connection.peer_app_extensions(), 0);
    }
}

/// From a cold start, the delivery rate reaches 90 % of the bottleneck within 10 RTTs of the
/// first byte.
#[test]
fn reaches_90_percent_within_ten_round_trips() {
    let mut pair = pair(LinkConfig::new(RTT, 100), 5);
    let mut transfers = endless_stream(&mut pair);
    run_for(&mut pair, &mut transfers, Duration::from_secs(3));
    let first = first_rtt_at_90_percent(&transfers);
    assert!(
        first < 10,
        "first bucket at 90 %: {first}: {:?}",
        &transfers.delivered[..12]
    );
}

/// Which side initiated the handshake does not change how fast a transfer ramps up. The
/// initiator confirms the keys with a PING; its ACK is the connection's first delivery
/// sample (a few bytes per round trip), and it once became the bottleneck estimate: the
/// initiator's first window shrank from 2.9 initial windows to eight packets, and its
/// transfers delivered a round trip later than the responder's (the gateways' "bimodal
/// cold start": two gateways that start together initiate at once, and which one wins is
/// decided by their keys). The handshake's RTT sample is also inflated here, as an
/// initiation that waits for address resolution inflates it: the first round is paced by
/// the minimum RTT known when it starts, not by that sample.
#[test]
fn the_initiator_ramps_up_as_fast_as_the_responder() {
    let first_rounds = |from: usize| {
        let forward = LinkConfig::new(RTT, 100);
        let reverse = LinkConfig::new(RTT, 100);
        let config = crate::testing::transport_config();
        let mut pair = Pair::with_config(crate::test_epoch(), forward, reverse, 12, config);
        // The initiation waits 50 ms on its way (the first datagram to a new neighbour).
        pair.set_delay(0, RTT / 2 + 50 * MS);
        pair.initiate(0);
        pair.step();
        pair.set_delay(0, RTT / 2);
        pair.connect();
        // The session arrives after the handshake's PING was acknowledged, as in the lab.
        let idle_until = pair.now + 150 * MS;
        pair.run_until(Duration::from_secs(1), |p| p.now >= idle_until);
        let mut transfers = Transfers::new(from);
        transfers.start(&mut pair, 1 << 40);
        run_for(&mut pair, &mut transfers, Duration::from_millis(500));
        transfers.delivered[..4].to_vec()
    };
    let initiator = first_rounds(0);
    let responder = first_rounds(1);
    let (i, r) = (initiator.iter().sum::<u64>(), responder.iter().sum::<u64>());
    assert!(
        i as f64 >= 0.9 * r as f64,
        "the first four round trips delivered {i} bytes from the initiator, {r} from the \
         responder: {initiator:?} against {responder:?}"
    );
}

/// A tunnel that idled first (only keepalive PINGs crossing it for many rounds) still ramps
/// up like a fresh one: rounds in which the sender had nothing to send say nothing about
/// whether the pipe is full.
#[test]
fn an_idle_tunnel_still_ramps_up_quickly() {
    let mut config = crate::testing::transport_config();
    config.keepalive = MS * 250;
    let mut pair = pair_with(LinkConfig::new(RTT, 100), 7, config);
    let idle_until = pair.now + Duration::from_secs(5);
    pair.run_until(Duration::from_secs(6), |p| p.now >= idle_until);
    let mut transfers = endless_stream(&mut pair);
    run_for(&mut pair, &mut transfers, Duration::from_secs(3));
    let first = first_rtt_at_90_percent(&transfers);
    assert!(
        first < 10,
        "first bucket at 90 %: {first}: {:?}",
        &transfers.delivered[..12]
    );
}

/// A second connection to the same peer starts from what the first learned: 90 % within three
/// round trips.
#[test]
fn a_warm_start_reaches_90_percent_within_three_round_trips() {
    let mut pair = pair(LinkConfig::new(RTT, 100), 6);
    let mut transfers = Transfers::new(0);
    transfers.start(&mut pair, 30_000_000);
    transfers.run(&mut pair, Duration::from_secs(30));
    transfers.verify();
    let hint = pair.client().path_hint().expect("the path was learned");
    assert!(hint.rate > RATE * 9 / 10, "{hint:?}");
    // Close and reconnect; the endpoint keeps the hint.
    let now = pair.now;
    pair.client().close(now, 0, b"done");
    pair.run_until(Duration::from_secs(5), |p| {
        p.sides[0].connections.is_empty()
    });
    pair.sides[1].connections.clear();
    pair.connect();
    let mut transfers = endless_stream(&mut pair);
    run_for(&mut pair, &mut transfers, Duration::from_secs(1));
    let first = first_rtt_at_90_percent(&transfers);
    assert!(
        first < 3,
        "first bucket at 90 %: {first}: {:?}",
        transfers.delivered
    );
}

/// Answers of 64 KiB, one at a time, from side 1 (the far gateway answering a client that
/// keeps one request outstanding): how long each took from the first byte written to the
/// last byte's arrival, each started half an RTT (the request's way) after the last one
/// arrived.
pub(super) fn answers(pair: &mut Pair, count: usize) -> Vec<Duration> {
    let mut transfers = Transfers::new(1);
    let mut took = Vec::new();
    for _ in 0..count {
        let asked = pair.now + RTT / 2;
        pair.run_until(RTT, |p| {
            transfers.pump(p);
            p.now >= asked
        });
        let start = pair.now;
        let id = transfers.start(pair, 64 * 1024);
        pair.run_until(Duration::from_secs(10), |p| {
            transfers.pump(p);
            transfers.by_id[&id].complete
        });
        let arrived = transfers.by_id[&id].completed_at.expect("complete");
        took.push(arrived - start);
    }
    transfers.verify();
    took
}

/// The longest of `took`, as a share of the RTT, counting the request's half: what one
/// exchange of a client with one request outstanding costs.
pub(super) fn worst_exchange(took: &[Duration]) -> f64 {
    let worst = took.iter().max().copied().unwrap_or_default();
    (worst + RTT / 2).as_secs_f64() / RTT.as_secs_f64()
}

/// With the path's rate configured (`max_rate`), a tunnel that only ever carries
/// request/response exchanges sends each 64 KiB answer at that rate from the first: an
/// exchange costs at most 1.05 RTT on a 500 Mbit/s path.
#[test]
fn with_the_rate_configured_each_answer_leaves_at_once() {
    let link = LinkConfig::new(RTT, 500);
    let configured = TransportConfig {
        max_rate: link.rate,
        ..crate::testing::transport_config()
    };
    let mut pair = pair_with(link, 33, configured);
    let took = answers(&mut pair, 30);
    let worst = worst_exchange(&took);
    assert!(worst <= 1.05, "worst exchange {worst:.3} RTT: {took:?}");
}

/// Without a configured rate, a cold tunnel learns the path from the answers themselves.
/// Every delivery sample of an answer shorter than a round trip runs from its first packet's
/// departure and so measures only the application (about 1.5 RTT per exchange, for ever,
/// when that was all the controller had); the answer's arrival spread at the receiver shows
/// the rate the path carried it at, and Rapid Start's gain raises the pacing rate from it
/// answer by answer. From the sixth exchange on, each costs at most 1.05 RTT, and the
/// estimate never exceeds what the path carries.
#[test]
fn a_cold_tunnel_learns_the_path_from_the_answers() {
    let link = LinkConfig::new(RTT, 500);
    let mut pair = pair_with(link, 33, crate::testing::transport_config());
    let took = answers(&mut pair, 30);
    let worst = worst_exchange(&took[5..]);
    assert!(
        worst <= 1.05,
        "worst exchange after five {worst:.3} RTT: {took:?}"
    );
    let learned = pair.server().stats().congestion.expect("adaptive");
    // The bottleneck estimate counts UDP payload; the link's rate counts IP bytes.
    assert!(learned.bottleneck_rate <= 500_000_000 / 8, "{learned:?}");
}

/// A tunnel that learned the path from bulk data keeps what it learned through a long run
/// of request/response exchanges at 1 % loss: samples taken while the application held the
/// sender back never lower the estimate, so every answer leaves at the path's rate.
#[test]
fn answers_after_bulk_keep_the_learned_rate() {
    let link = LinkConfig::new(RTT, 100).with_loss(0.01);
    let mut pair = pair_with(link, 34, crate::testing::transport_config());
    let mut bulk = Transfers::new(1);
    bulk.start(&mut pair, 40_000_000);
    bulk.run(&mut pair, Duration::from_secs(30));
    bulk.verify();
    let learned = pair.server().stats().congestion.expect("adaptive");
    assert!(learned.bottleneck_rate > RATE * 9 / 10, "{learned:?}");
    let took = answers(&mut pair, 100);
    let after = pair.server().stats().congestion.expect("adaptive");
    assert!(
        after.bottleneck_rate >= learned.bottleneck_rate * 9 / 10,
        "{learned:?} -> {after:?}"
    );
    // At 100 Mbit/s a 64 KiB answer takes 5.2 ms on the wire; a lost packet costs a round
    // trip, so look at the median exchange.
    let mut sorted = took.clone();
    sorted.sort();
    let median = worst_exchange(&sorted[..=sorted.len() / 2]);
    assert!(median <= 1.07, "median exchange {median:.3} RTT: {took:?}");
}

/// When the bottleneck halves, the controller sees congestion (not random loss), the loss
/// rate falls below 3 % within two round trips, and the link stays in use at its new rate.
///
/// Whether one run meets all three depends on its seed: over seeds 8-21, two to three miss
/// one check (a 100 ms window two RTTs after detection losing 3-14 %, when the overflow's
/// first losses were taken for random loss; or utilization 0.80-0.84 after the halving),
/// with 1 ms or 2 ms pacing bursts, before and after the handshake's PING stopped setting
/// the first estimate. A single seed flipped with unrelated changes to the start-up, so the
/// test runs all fourteen and allows three misses: a controller that no longer yields to a
/// shrinking bottleneck misses them all.
#[test]
fn when_the_bottleneck_halves_loss_settles_within_two_round_trips() {
    let misses: Vec<(u64, String)> = (8..22)
        .filter_map(|seed| halving(seed).err().map(|why| (seed, why)))
        .collect();
    assert!(
        misses.len() <= 3,
        "{} seeds of 14 missed: {misses:#?}",
        misses.len()
    );
}

/// One run of [`when_the_bottleneck_halves_loss_settles_within_two_round_trips`]: the
/// first check it misses, if any.
fn halving(seed: u64) -> Result<(), String> {
    // With adaptive FEC, as deployed: the overflow's losses are the controller's verdict,
    // not the path's loss rate, so they buy no parity that would crowd out the data.
    let config = TransportConfig {
        fec: FecMode::Adaptive,
        ..TransportConfig::default()
    };
    let mut pair = pair_with(LinkConfig::new(RTT, 100).with_loss(0.001), seed, config);
    let mut transfers = endless_stream(&mut pair);
    run_for(&mut pair, &mut transfers, Duration::from_secs(5));
    let events_before = congestion_events(&mut pair);
    pair.set_rate(0, RATE / 2);
    // Sample the forward link every 10 ms: when did congestion get detected, and what was the
    // loss rate in each RTT after.
    let mut samples = Vec::new();
    let mut detected = None;
    for i in 0..300 {
        run_for(&mut pair, &mut transfers, 10 * MS);
        let s = pair.link_stats(0);
        samples.push((s.sent, s.dropped_queue + s.dropped_loss));
        if detected.is_none() && congestion_events(&mut pair) > events_before {
            detected = Some(i);
        }
    }
    let detected = detected.ok_or("the halving was not taken for congestion")?;
    // Loss over each 100 ms window starting two RTTs (20 samples) after detection.
    for start in (detected + 20..samples.len() - 10).step_by(10) {
        let (sent0, lost0) = samples[start];
        let (sent1, lost1) = samples[start + 10];
        let loss = (lost1 - lost0) as f64 / (sent1 - sent0).max(1) as f64;
        if loss >= 0.03 {
            return Err(format!(
                "loss {loss:.3} in the window {} ms after detection at {} ms: {:?}",
                (start - detected) * 10,
                detected * 10,
                pair.client().stats().congestion
            ));
        }
    }
    let u = utilization(&transfers, 60, 75, RATE / 2);
    if u <= 0.85 {
        return Err(format!("utilization after the halving {u:.3}"));
    }
    Ok(())
}

/// A route change to a longer path: once the old minimum RTT has aged out of its window,
/// the longer RTT is the new minimum, and random loss is again taken for what it is instead
/// of for a full queue.
#[test]
fn after_a_route_change_to_a_longer_path_random_loss_is_random_again() {
    let mut pair = pair(LinkConfig::new(50 * MS, 100).with_loss(0.01), 11);
    let mut transfers = endless_stream(&mut pair);
    run_for(&mut pair, &mut transfers, Duration::from_secs(5));
    pair.set_delay(0, 75 * MS);
    pair.set_delay(1, 75 * MS);
    run_for(&mut pair, &mut transfers, Duration::from_secs(40));
    let state = pair
        .client()
        .stats()
        .congestion
        .expect("a controller state");
    assert!(state.min_rtt >= 145 * MS, "{state:?}");
    // Goodput from 25 s after the change on.
    let u = utilization(&transfers, 300, 450, RATE);
    assert!(
        u > 0.88,
        "utilization {u:.3} after the route change: {state:?}"
    );
}

fn congestion_events(pair: &mut Pair) -> u64 {
    pair.client()
        .stats()
        .congestion
        .map_or(0, |c| c.congestion_events)
}

/// Ten bulk streams share the connection equally: Jain's index over their goodput is at least
/// 0.99.
#[test]
fn ten_streams_share_fairly() {
    let mut pair = pair(LinkConfig::new(RTT, 100), 8);
    let mut transfers = Transfers::new(0);
    for _ in 0..10 {
        transfers.start(&mut pair, 1 << 40);
    }
    run_for(&mut pair, &mut transfers, Duration::from_secs(3));
    let before: Vec<u64> = transfers
        .order
        .iter()
        .map(|id| transfers.by_id[id].received)
        .collect();
    run_for(&mut pair, &mut transfers, Duration::from_secs(10));
    let shares: Vec<f64> = transfers
        .order
        .iter()
        .zip(&before)
        .map(|(id, b)| (transfers.by_id[id].received - b) as f64)
        .collect();
    let sum: f64 = shares.iter().sum();
    let squares: f64 = shares.iter().map(|x| x * x).sum();
    let jain = sum * sum / (shares.len() as f64 * squares);
    assert!(jain >= 0.99, "Jain index {jain:.4}: {shares:?}");
    assert!(sum / 10.0 > 0.9 * RATE as f64, "aggregate goodput {sum}");
}

/// A scheduler that serves the newest stream first and lets the others wait: the stream layer
/// must follow whatever order a `Scheduler` gives (the shaper's hook).
#[derive(Debug, Default)]
struct NewestFirst(std::collections::BTreeSet<crate::StreamId>);

impl crate::Scheduler for NewestFirst {
    fn push(&mut self, id: crate::StreamId) {
        self.0.insert(id);
    }
    fn next(&mut self, _now: Instant) -> Option<crate::Turn> {
        let id = *self.0.last()?;
        Some(crate::Turn {
            id,
            max_bytes: 1000,
        })
    }
    fn sent(&mut self, id: crate::StreamId, bytes: usize, more: bool, _now: Instant) {
        assert!(bytes <= 1000, "a turn of {bytes} bytes");
        if !more {
            self.0.remove(&id);
        }
    }
    fn remove(&mut self, id: crate::StreamId) {
        self.0.remove(&id);
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Three streams written at once under a scheduler that serves the newest first: the last
/// one completes before the first one has received anything, and all arrive intact.
#[test]
fn a_custom_scheduler_decides_which_stream_sends() {
    let mut pair = pair(LinkConfig::new(RTT, 10), 11);
    pair.client()
        .set_scheduler(Box::new(NewestFirst::default()));
    let mut transfers = Transfers::new(0);
    let ids: Vec<_> = (0..3)
        .map(|_| transfers.start(&mut pair, 2_000_000))
        .collect();
    pair.run_until(Duration::from_secs(60), |p| {
        transfers.pump(p);
        transfers.by_id[&ids[2]].received == 2_000_000
    });
    assert_eq!(
        transfers.by_id[&ids[0]].received, 0,
        "the oldest stream waited"
    );
    transfers.run(&mut pair, Duration::from_secs(60));
    transfers.verify();
}

/// A scheduler that holds its streams to 100 kB/s (1,000-byte turns, 10 ms apart), as the
/// shaper does below the path's rate.
#[derive(Debug, Default)]
struct Metered {
    queue: std::collections::VecDeque<crate::StreamId>,
    next: Option<Instant>,
}

impl crate::Scheduler for Metered {
    fn push(&mut self, id: crate::StreamId) {
        self.queue.push_back(id);
    }
    fn next(&mut self, now: Instant) -> Option<crate::Turn> {
        if self.next.is_some_and(|t| t > now) {
            return None;
        }
        let id = *self.queue.front()?;
        Some(crate::Turn {
            id,
            max_bytes: 1000,
        })
    }
    fn sent(&mut self, id: crate::StreamId, bytes: usize, more: bool, now: Instant) {
        let from = self.next.map_or(now, |t| t.max(now));
        self.next = Some(from + MS * 10 * bytes as u32 / 1000);
        if !more {
            self.queue.retain(|&q| q != id);
        }
    }
    fn remove(&mut self, id: crate::StreamId) {
        self.queue.retain(|&q| q != id);
    }
    fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
    fn poll_timeout(&self, _now: Instant) -> Option<Instant> {
        self.next.filter(|_| !self.is_empty())
    }
}

/// A scheduler that holds its streams to a rate far below the path's: the data arrives at
/// that rate, the connection wakes up when the scheduler says (it neither spins while held
/// nor sleeps past the time), and the path's estimate is not dragged down to the held rate.
#[test]
fn a_scheduler_that_holds_streams_sets_the_pace() {
    let mut pair = pair(LinkConfig::new(RTT, 100), 12);
    pair.client().set_scheduler(Box::new(Metered::default()));
    let mut transfers = Transfers::new(0);
    let id = transfers.start(&mut pair, 500_000);
    let start = pair.now;
    let mut steps = 0u64;
    while transfers.by_id[&id].received < 500_000 {
        assert!(pair.step(), "the connection stopped waking up");
        transfers.pump(&mut pair);
        steps += 1;
        assert!(steps < 100_000, "spinning: {steps} steps");
    }
    // 500 turns of 1,000 bytes, 10 ms apart, plus a one-way delay.
    let took = pair.now - start;
    assert!(
        took >= Duration::from_millis(4950) && took <= Duration::from_millis(5200),
        "{took:?}"
    );
    transfers.verify();
}

/// A stream bounded to 4,000 unsent bytes (a shaper's queue bound) refuses writes beyond
/// them, and is writable again once its sending drained the queue to half, well before any
/// acknowledgment could come back.
#[test]
fn a_queue_bound_on_unsent_bytes_frees_room_by_sending() {
    let mut pair = pair(LinkConfig::new(RTT, 20), 13);
    pair.connect();
    let id = pair.client().open_stream(StreamMeta::default()).unwrap();
    pair.client().set_unsent_limit(id, 4_000);
    let data = vec![7u8; 10_000];
    let accepted = pair.client().write(id, &data).unwrap();
    assert_eq!(accepted, 4_000);
    assert!(pair.client().write(id, &data).is_err(), "the bound holds");
    let blocked_at = pair.now;
    let writable = loop {
        assert!(pair.step());
        let events = std::mem::take(&mut pair.sides[0].events);
        if events
            .iter()
            .any(|(_, e)| *e == crate::Event::StreamWritable(id))
        {
            break pair.now;
        }
        assert!(pair.now - blocked_at < RTT * 2, "never writable again");
    };
    assert!(
        writable - blocked_at < RTT / 2,
        "waited {:?}",
        writable - blocked_at
    );
    assert!(pair.client().write(id, &data).unwrap() > 0);
}

/// Streams marked with different DSCPs, sending at once over a lossy path: every burst
/// carries one stream's DSCP, so each DSCP's datagrams carry that stream's data (and
/// their packets' overhead) and no more; both complete intact.
#[test]
fn each_burst_carries_the_dscp_of_its_streams() {
    let mut pair = pair(LinkConfig::new(RTT, 50).with_loss(0.01), 21);
    pair.connect();
    let mut transfers = Transfers::new(0);
    let voice = transfers.start(&mut pair, 400_000);
    let bulk = transfers.start(&mut pair, 1_200_000);
    transfers.start(&mut pair, 300_000);
    pair.client().set_dscp(voice, 46);
    pair.client().set_dscp(bulk, 10);
    let before = pair.sides[0].sent_by_dscp;
    transfers.run(&mut pair, Duration::from_secs(30));
    transfers.verify();
    let sent: Vec<u64> = (0..64)
        .map(|d| pair.sides[0].sent_by_dscp[d] - before[d])
        .collect();
    // Headers, tags, retransmissions after 1 % loss and FEC parity (unmarked) on top of
    // the payload; nothing of one stream under another's mark.
    let within = |bytes: u64, payload: u64| bytes >= payload && bytes < payload * 115 / 100;
    assert!(within(sent[46], 400_000), "{sent:?}");
    assert!(within(sent[10], 1_200_000), "{sent:?}");
    assert!(sent[0] >= 300_000, "{sent:?}");
    let marked: u64 = sent
        .iter()
        .enumerate()
        .filter(|&(d, _)| d != 0 && d != 10 && d != 46)
        .map(|(_, b)| b)
        .sum();
    assert_eq!(marked, 0, "{sent:?}");
}

/// A stream's buffers keep their memory while data flows (shrinking one each time a fast
/// stream empties it cost the receiving gateway a third of its CPU), and give all of it
/// back once the stream, still open, goes quiet.
#[test]
fn an_open_stream_keeps_its_buffers_while_busy_and_gives_them_back_when_quiet() {
    /// Past this, a buffer must not shrink mid-transfer.
    const LARGE: usize = 64 * 1024;
    let mut pair = pair(LinkConfig::new(RTT, 100), 14);
    pair.connect();
    let id = pair.client().open_stream(StreamMeta::default()).unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let (mut written, mut read) = (0, 0);
    let mut buf = vec![0u8; 16 * 1024];
    let mut peak = [0usize; 2];
    let mut steps = 0u64;
    while read < data.len() {
        if written < data.len() {
            if let Ok(n) = pair.client().write(id, &data[written..]) {
                written += n;
            }
        }
        assert!(pair.step(), "the simulation went idle");
        // The reader drains what arrived in batches, as a relay does between its wake-ups.
        steps += 1;
        if steps % 64 == 0 || written == data.len() {
            while let Ok(Some(n)) = pair.server().read(id, &mut buf) {
                assert_eq!(&buf[..n], &data[read..read + n]);
                read += n;
            }
        }
        let now = [
            pair.client().stream_buffer_bytes(),
            pair.server().stream_buffer_bytes(),
        ];
        for side in 0..2 {
            // Once large, a buffer does not shrink while the transfer runs.
            if peak[side] > LARGE && read < data.len() {
                assert!(
                    now[side] >= peak[side],
                    "side {side} shrank to {} from {} mid-transfer",
                    now[side],
                    peak[side]
                );
            }
            peak[side] = peak[side].max(now[side]);
        }
    }
    assert!(peak.iter().all(|&p| p > LARGE), "{peak:?}");
    // Quiet, the stream still open: within two sweeps neither side holds any buffer.
    let quiet = pair.now;
    pair.run_until(Duration::from_secs(3), |p| {
        p.client().stream_buffer_bytes() == 0 && p.server().stream_buffer_bytes() == 0
    });
    assert!(
        pair.now - quiet <= Duration::from_millis(2100),
        "{:?}",
        pair.now - quiet
    );
    // And the stream still works.
    assert_eq!(pair.client().write(id, b"more").unwrap(), 4);
    pair.run_until(Duration::from_secs(2), |p| {
        matches!(p.server().read(id, &mut [0u8; 8]), Ok(Some(4)))
    });
}

/// A thousand streams, opened at once over a lossy path, all complete intact; afterwards no
/// stream state is left, the buffers were bounded by the windows, and the room the burst
/// took in the stream maps is given back.
#[test]
fn a_thousand_streams_complete_and_leave_nothing_behind() {
    let mut pair = pair(LinkConfig::new(RTT, 100).with_loss(0.01), 9);
    let mut transfers = Transfers::new(0);
    for i in 0..1000u64 {
        transfers.start(&mut pair, 20_000 + i * 37);
    }
    transfers.run(&mut pair, Duration::from_secs(60));
    transfers.verify();
    // Both sides forget every stream once both directions are finished and acknowledged.
    pair.run_until(Duration::from_secs(5), |p| {
        transfers.pump(p);
        p.client().open_streams() == 0 && p.server().open_streams() == 0
    });
    // Room for 1,792 at the peak; kept, it would be a thousand streams' worth of memory.
    for side in [pair.client().stream_slots(), pair.server().stream_slots()] {
        assert!(side < 1000, "{side} slots kept after every stream closed");
    }
}

/// A side that lost its connection (it restarted) and initiates again replaces the one the
/// other side kept, whichever side made the old one (so whichever has the larger key, which
/// wins when both initiate at once), and however soon after the old one was made.
#[test]
fn a_restarted_peer_replaces_the_connection_the_other_side_kept() {
    for (kept_by, restart_after) in [(0, 12), (1, 12), (0, 1), (1, 1)] {
        let restarted = 1 - kept_by;
        let link = LinkConfig::new(RTT, 100);
        let mut pair = Pair::new(crate::test_epoch(), link.clone(), link, 21);
        pair.initiate_to(kept_by, restarted);
        let established = |p: &Pair, i: usize| {
            p.sides[i]
                .connections
                .values()
                .any(Connection::is_established)
        };
        pair.run_until(Duration::from_secs(5), |p| {
            established(p, 0) && established(p, 1)
        });
        let old: Vec<_> = pair.sides[kept_by].connections.keys().copied().collect();
        // After the window in which both sides' attempts race, and well within it: the
        // peer answered the old one, so a new initiation is no race.
        let quiet = pair.now + Duration::from_secs(restart_after);
        pair.run_until(Duration::from_secs(15), |p| p.now >= quiet);
        pair.restart(restarted);
        pair.initiate_to(restarted, kept_by);
        // Its first attempt is taken (no retry, 1 s later, needed), well within the kept
        // connection's idle timeout (30 s), which would end it anyway.
        pair.run_until(Duration::from_millis(900), |p| {
            established(p, restarted)
                && established(p, kept_by)
                && !p.sides[kept_by].connections.keys().any(|h| old.contains(h))
        });
    }
}

/// A side that connects again while it still holds its connection (two gateways' tasks
/// racing) gets the new one, and the old one ends on both sides at once: the other side
/// closes it with `CLOSE_REPLACED` instead of leaving it silent.
#[test]
fn a_connection_replaced_while_its_maker_holds_it_is_closed_on_both_sides() {
    let link = LinkConfig::new(RTT, 100);
    let mut pair = Pair::new(crate::test_epoch(), link.clone(), link, 23);
    pair.connect();
    let old = *pair.sides[0].connections.keys().next().expect("connected");
    pair.initiate_to(0, 1);
    let told = Event::ConnectionLost(ConnectionError::PeerClosed {
        code: crate::CLOSE_REPLACED,
        reason: "replaced by a newer connection".into(),
    });
    pair.run_until(RTT * 3, |p| {
        p.sides[0].events.contains(&(old, told.clone()))
            && p.sides[0]
                .connections
                .values()
                .any(Connection::is_established)
    });
    let replaced = Event::ConnectionLost(ConnectionError::Replaced);
    assert!(pair.sides[1].events.iter().any(|(_, e)| *e == replaced));
}

/// A side the peer connected to a moment ago does not connect back: the peer would take the
/// second connection for a restart of ours and end the first, with what it carries (two
/// gateways starting at once, one accepting the other's connection just before its own
/// attempt). Once the peer's connection is older than a race can explain, it may.
#[test]
fn a_side_the_peer_just_connected_to_does_not_connect_back() {
    let link = LinkConfig::new(RTT, 100);
    let mut pair = Pair::new(crate::test_epoch(), link.clone(), link, 25);
    pair.connect();
    let (addr, key) = (pair.sides[0].addr, pair.sides[0].endpoint.public_key());
    let unix = Duration::from_secs(1_800_000_000);
    let connect_back = |p: &mut Pair| p.sides[1].endpoint.connect(p.now, unix, addr, key);
    assert_eq!(
        connect_back(&mut pair).err(),
        Some(crate::ConnectError::PeerConnecting(key))
    );
    let later = pair.now + crate::endpoint::SIMULTANEOUS;
    pair.run_until(Duration::from_secs(15), |p| p.now >= later);
    assert!(
        pair.sides[1]
            .connections
            .values()
            .all(Connection::is_established)
    );
    assert!(connect_back(&mut pair).is_ok());
}

/// Both sides initiate at the same moment, over a lossy path: they settle on one
/// connection, the same on both sides (each hears the other on it), and the attempt that
/// lost ends on both.
#[test]
fn both_sides_initiating_at_once_settle_on_one_connection() {
    for seed in 0..20 {
        let link = LinkConfig::new(RTT, 100).with_loss(0.1);
        let mut pair = Pair::new(crate::test_epoch(), link.clone(), link, 40 + seed);
        pair.initiate_to(0, 1);
        pair.initiate_to(1, 0);
        // One established connection a side, and the other side's keepalives (one a
        // second) arrive on it: a side left holding the attempt that lost would hear
        // nothing on it.
        let settled = |p: &Pair| {
            p.sides.iter().all(|side| {
                side.connections.len() == 1
                    && side.connections.values().all(|c| {
                        c.is_established()
                            && p.now.saturating_duration_since(c.last_heard())
                                < Duration::from_secs(3)
                    })
            })
        };
        pair.run_until(Duration::from_secs(30), |p| settled(p));
        let until = pair.now + Duration::from_secs(6);
        pair.run_until(Duration::from_secs(7), |p| {
            assert!(
                settled(p),
                "seed {seed}: unsettled again at {:?}",
                p.now - p.epoch
            );
            p.now >= until
        });
    }
}

/// Both directions at once: each side sends a stream to the other.
#[test]
fn both_directions_carry_data_at_once() {
    let link = LinkConfig::new(MS * 50, 50).with_loss(0.005);
    let mut pair = Pair::new(crate::test_epoch(), link.clone(), link, 10);
    pair.connect();
    let mut up = Transfers::new(0);
    let mut down = Transfers::new(1);
    up.start(&mut pair, 3_000_000);
    down.start(&mut pair, 3_000_000);
    pair.run_until(Duration::from_secs(30), |pair| {
        // Each side's events are shared by both transfers: hand each its own.
        let events = [
            std::mem::take(&mut pair.sides[0].events),
            std::mem::take(&mut pair.sides[1].events),
        ];
        pair.sides[0].events = events[0].clone();
        pair.sides[1].events = events[1].clone();
        up.pump(pair);
        pair.sides[0].events = events[0].clone();
        pair.sides[1].events = events[1].clone();
        down.pump(pair);
        up.all_complete() && down.all_complete()
    });
    up.verify();
    down.verify();
}

/// A reset stream stops at once on both sides, and others carry on.
#[test]
fn a_reset_stream_is_abandoned_and_the_others_complete() {
    let mut pair = pair(LinkConfig::new(RTT, 20), 11);
    let mut transfers = Transfers::new(0);
    let doomed = transfers.start(&mut pair, 50_000_000);
    transfers.start(&mut pair, 2_000_000);
    run_for(&mut pair, &mut transfers, Duration::from_secs(1));
    pair.client().reset(doomed, 7).expect("the stream exists");
    transfers.run(&mut pair, Duration::from_secs(30));
    assert_eq!(transfers.by_id[&doomed].reset, Some(7));
    transfers.verify();
    pair.run_until(Duration::from_secs(5), |p| {
        transfers.pump(p);
        p.client().open_streams() == 0 && p.server().open_streams() == 0
    });
}

/// Control messages arrive once each, in order, over a lossy path.
#[test]
fn control_messages_arrive_in_order_despite_loss() {
    let link = LinkConfig::new(RTT, 10).with_loss(0.2);
    let mut pair = Pair::new(crate::test_epoch(), link.clone(), link, 12);
    pair.connect();
    let mut received = Vec::new();
    let mut next = 0u32;
    pair.run_until(Duration::from_secs(120), |pair| {
        while next < 500 && pair.client().send_control(&next.to_be_bytes()).is_ok() {
            next += 1;
        }
        for (_, event) in pair.sides[1].events.drain(..) {
            if let crate::Event::Control(message) = event {
                received.push(u32::from_be_bytes(message.try_into().expect("4 bytes")));
            }
        }
        received.len() == 500
    });
    assert_eq!(received, (0..500).collect::<Vec<_>>());
}

/// Flow control keeps a slow reader's buffers bounded: the sender stops at the window.
#[test]
fn a_slow_reader_bounds_the_buffers() {
    let transport = TransportConfig {
        stream_window: 1 << 20,
        stream_send_buffer: 2 << 20,
        ..TransportConfig::default()
    };
    let link = LinkConfig::new(RTT, 100);
    let mut pair = Pair::with_config(crate::test_epoch(), link.clone(), link, 13, transport);
    pair.connect();
    let id = pair
        .client()
        .open_stream(StreamMeta::default())
        .expect("open");
    let chunk = vec![0u8; 64 * 1024];
    let mut written = 0;
    pair.run_until(Duration::from_secs(10), |pair| {
        while let Ok(n) = pair.client().write(id, &chunk) {
            written += n;
        }
        pair.now - pair.epoch > Duration::from_secs(5)
    });
    // Nobody reads: the peer holds one window (delivered and acknowledged, so gone from the
    // send buffer); the sender queues what the path's pace allows, within its send buffer.
    let stats = pair.client().stats();
    assert_eq!(
        stats.send_buffered, stats.send_unsent,
        "nothing unacknowledged"
    );
    // The budget is the window when the data was written; the window may have moved by a
    // packet since (measured: 1,368 bytes).
    assert!(
        stats.send_unsent <= stats.send_budget.min(2 << 20) + u64::from(stats.datagram_size),
        "{stats:?}"
    );
    assert!(stats.send_unsent >= 256 * 1024, "{stats:?}");
    assert_eq!(written as u64, (1 << 20) + stats.send_unsent);
    // Nothing but keepalive PINGs is in flight: everything the window allowed was delivered.
    let in_flight = pair.client().bytes_in_flight();
    assert!(in_flight < 100, "{in_flight} bytes in flight");
    let mut buf = vec![0u8; 4 << 20];
    let got = pair
        .server()
        .read(id, &mut buf)
        .expect("data is there")
        .expect("not finished");
    assert_eq!(got, 1 << 20, "the receiver holds exactly one window");
}

/// An application that writes as fast as the stream takes, over a 100 Mbit/s path of
/// 100 ms with 1 % loss: the sender queues no more than the congestion window of unsent
/// bytes, and holds in all (with what is in flight and data acknowledged above a repair
/// still on its way) a few of the path's bandwidth-delay products, not the 8 MiB its send
/// buffer allows; and the path stays as full as without the bound.
#[test]
fn a_fast_writer_is_read_at_the_pace_of_the_path() {
    let bdp = RATE / 10;
    let mut pair = pair(LinkConfig::new(RTT, 100).with_loss(0.01), 29);
    let mut transfers = endless_stream(&mut pair);
    let (mut most, mut most_unsent, mut most_listed) = (0, 0, 0);
    let (mut total, mut total_unsent, mut samples) = (0u128, 0u128, 0u128);
    let steady = pair.now + Duration::from_secs(3);
    let end = pair.now + Duration::from_secs(20);
    pair.run_until(Duration::from_secs(21), |pair| {
        transfers.pump(pair);
        if pair.now >= steady {
            let stats = pair.client().stats();
            most = most.max(stats.send_buffered);
            most_unsent = most_unsent.max(stats.send_unsent);
            most_listed = most_listed.max(pair.client().blocked_listed());
            total += u128::from(stats.send_buffered);
            total_unsent += u128::from(stats.send_unsent);
            samples += 1;
        }
        pair.now >= end
    });
    let mean = |t: u128| (t / samples.max(1)) as f64 / bdp as f64;
    let (mean, mean_unsent) = (mean(total), mean(total_unsent));
    let (most, most_unsent) = (most as f64 / bdp as f64, most_unsent as f64 / bdp as f64);
    // Seen: unsent 2.25 BDP at most (1.69 on average); held 6.03 at most, 3.75 on average.
    // Adaptive FEC leaves a bulk transfer's independent losses to retransmission, so data
    // acknowledged above a loss waits a round trip for the resent packet; while parity
    // repaired them, 4.77 at most and 3.37 on average. Without the pace, the stream's 8 MiB
    // send buffer (6.7 BDP) was the only limit.
    assert!(most_unsent <= 3.0, "queued {most_unsent:.2} BDP");
    assert!(
        mean_unsent >= 1.0,
        "queued only {mean_unsent:.2} BDP: the pacer may starve"
    );
    assert!(
        most <= 6.5,
        "held {most:.2} BDP: near the send buffer's 6.7"
    );
    assert!(mean <= 4.0, "held {mean:.2} BDP on average");
    // A writer its own sending wakes again and again stays listed once.
    assert!(
        most_listed <= 2,
        "{most_listed} entries for one blocked writer"
    );
    let used = utilization(&transfers, 30, 200, RATE);
    assert!(used >= 0.90, "utilization {used:.3}");
}

#[derive(Debug, Clone)]
struct Impairments {
    loss: f64,
    burst: Option<(f64, f64)>,
    reorder: f64,
    duplicate: f64,
    corrupt: f64,
    rtt_ms: u64,
}

fn impairments() -> impl Strategy<Value = Impairments> {
    (
        0.0..0.15f64,
        proptest::option::of((0.001..0.02f64, 0.3..0.8f64)),
        0.0..0.1f64,
        0.0..0.05f64,
        0.0..0.02f64,
        1u64..400,
    )
        .prop_map(
            |(loss, burst, reorder, duplicate, corrupt, rtt_ms)| Impairments {
                loss,
                burst,
                reorder,
                duplicate,
                corrupt,
                rtt_ms,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever the path does — loss, bursts, reordering, duplication, corruption, in both
    /// directions — every byte of every stream arrives exactly once and in order, including
    /// streams that end early and one that is reset.
    #[test]
    fn every_byte_arrives_exactly_once(seed in any::<u64>(), imp in impairments(), sizes in proptest::collection::vec(0u64..300_000, 1..6), fec_on in any::<bool>()) {
        let mut link = LinkConfig::new(MS * imp.rtt_ms as u32, 20);
        link.loss = imp.loss;
        link.burst = imp.burst;
        link.reorder = imp.reorder;
        link.reorder_delay = MS * imp.rtt_ms.max(4) as u32 / 4;
        link.duplicate = imp.duplicate;
        link.corrupt = imp.corrupt;
        // FEC "on" protects from the first packet; adaptive as the loss shows.
        let config = TransportConfig {
            fec: if fec_on { FecMode::On } else { FecMode::Adaptive },
            ..TransportConfig::default()
        };
        let mut pair = Pair::with_config(crate::test_epoch(), link.clone(), link, seed, config);
        pair.connect();
        let mut transfers = Transfers::new(0);
        for &size in &sizes {
            transfers.start(&mut pair, size);
        }
        let doomed = transfers.start(&mut pair, 10_000_000);
        run_for(&mut pair, &mut transfers, MS * 300);
        pair.client().reset(doomed, 1).expect("the stream is still open");
        transfers.by_id.get_mut(&doomed).expect("known").reset = Some(1);
        transfers.run(&mut pair, Duration::from_secs(600));
        transfers.verify();
    }
}

/// The side that accepted the connection sends as fast as the one that started it: a
/// gateway opens streams on whichever tunnel exists, whoever made it.
#[test]
fn the_responder_fills_the_path_too() {
    let mut pair = pair(LinkConfig::new(RTT, 100), 21);
    // Side 1 accepted; its data goes over the reverse link, so make that the bottleneck.
    pair.set_rate(1, RATE);
    let mut transfers = Transfers::new(1);
    transfers.start(&mut pair, 1 << 40);
    run_for(&mut pair, &mut transfers, Duration::from_secs(8));
    let u = utilization(&transfers, 30, 80, RATE);
    assert!(u >= 0.9, "utilization {u:.4}: {:#?}", pair.server().stats());
}

/// A loss burst can swallow every handshake attempt (here the Gilbert-Elliott channel stays
/// in its bad state across the five sparse initiations): the attempt ends with
/// `HandshakeTimedOut`, and a new one succeeds. Found by the property test above.
#[test]
fn a_handshake_lost_to_a_burst_is_retried() {
    let mut link = LinkConfig::new(MS, 20);
    link.burst = Some((0.018629740815542962, 0.3));
    let mut pair = Pair::new(
        crate::test_epoch(),
        link.clone(),
        link,
        14164706343959729424,
    );
    pair.connect();
    assert!(
        pair.now - pair.epoch > Duration::from_secs(31),
        "the first attempt gave up"
    );
}

/// A controller that records the RTT samples it is given, for the test below.
#[derive(Debug, Default)]
struct RecordSamples(std::sync::Mutex<Vec<Duration>>);

#[derive(Debug)]
struct Recorder {
    inner: Box<dyn crate::Controller>,
    log: std::sync::Arc<RecordSamples>,
}

impl crate::congestion::ControllerFactory for std::sync::Arc<RecordSamples> {
    fn build(
        &self,
        now: std::time::Instant,
        params: &crate::congestion::PathParams,
    ) -> Box<dyn crate::Controller> {
        let inner = crate::congestion::ControllerFactory::build(
            &crate::congestion::AdaptiveConfig::default(),
            now,
            params,
        );
        Box::new(Recorder {
            inner,
            log: self.clone(),
        })
    }
}

impl crate::Controller for Recorder {
    fn on_sent(&mut self, now: std::time::Instant, bytes: u64, in_flight: u64) {
        self.inner.on_sent(now, bytes, in_flight);
    }
    fn on_ack(&mut self, now: std::time::Instant, ack: &crate::congestion::AckEvent<'_>) {
        if let (Some(sample), Ok(mut log)) = (ack.rtt_sample, self.log.0.lock()) {
            log.push(sample);
        }
        self.inner.on_ack(now, ack);
    }
    fn on_loss(
        &mut self,
        now: std::time::Instant,
        loss: &crate::congestion::LossEvent<'_>,
    ) -> crate::LossVerdict {
        self.inner.on_loss(now, loss)
    }
    fn on_persistent_congestion(&mut self, now: std::time::Instant) {
        self.inner.on_persistent_congestion(now);
    }
    fn window(&self) -> u64 {
        self.inner.window()
    }
    fn pacing_rate(&self) -> u64 {
        self.inner.pacing_rate()
    }
    fn state(&self) -> crate::congestion::ControllerState {
        self.inner.state()
    }
    fn path_hint(&self) -> Option<crate::PathHint> {
        self.inner.path_hint()
    }
}

/// The RTT samples the controller judges queueing by exclude the time the peer held its
/// ACK: an idle tunnel's keepalive PINGs are acknowledged only after `max_ack_delay` (25 ms,
/// a quarter of this RTT, the Rapid Start threshold), and those samples once read as a full
/// queue when the first session's first loss came (the gateways' intermittent slow start).
#[test]
fn rtt_samples_for_the_controller_leave_out_the_ack_delay() {
    let log = std::sync::Arc::new(RecordSamples::default());
    let config = TransportConfig {
        keepalive: Duration::from_millis(200),
        congestion: crate::CongestionControl::Custom(std::sync::Arc::new(log.clone())),
        ..TransportConfig::default()
    };
    let mut pair = pair_with(LinkConfig::new(RTT, 100), 30, config);
    let until = pair.now + Duration::from_secs(3);
    pair.run_until(Duration::from_secs(4), |pair| pair.now >= until);
    let samples = log.0.lock().map(|l| l.clone()).unwrap_or_default();
    assert!(samples.len() >= 10, "{} samples", samples.len());
    let worst = samples.iter().max().copied().unwrap_or_default();
    assert!(
        worst < RTT + 5 * MS,
        "a sample of {worst:?} on an idle {RTT:?} path"
    );
}

/// Bursts of loss (Gilbert-Elliott, mean burst 3, about 1 % loss) on a line that is not
/// congested. The classifier learns the line's rate of loss runs and of long runs, so the
/// bursts are not taken for a full queue once learned. Measured (steady state): 96.0-96.8 %
/// with 1-8 congestion events in 21 s (the start's overshoot among them); when every
/// second run of three was congestion, 91.9-92.4 % with 28-38 events.
#[test]
fn burst_loss_on_an_uncongested_line_costs_little_rate() {
    for seed in 1..5 {
        let mut link = LinkConfig::new(RTT, 100);
        link.burst = Some((0.0034, 0.33));
        let mut pair = pair(link, seed);
        let mut transfers = endless_stream(&mut pair);
        run_for(&mut pair, &mut transfers, Duration::from_secs(21));
        let u = utilization(&transfers, 30, 200, RATE);
        let state = pair
            .client()
            .stats()
            .congestion
            .expect("a controller state");
        assert!(
            u >= 0.94 && state.congestion_events <= 12,
            "seed {seed}: utilization {u:.4}: {state:?}"
        );
    }
}

/// A bottleneck whose queue holds only 2 ms (a policer, a shallow switch buffer) shows no
/// rising RTT when it overflows: the loss runs and long runs above the line's learned rates
/// must still be taken for congestion, or the sender would keep probing into it. Measured:
/// 3.8-3.9 % of the packets dropped at the queue, 94.0 % of the link; with no verdicts but
/// RTT inflation, 7.7 % dropped (93.6 % of the link).
#[test]
fn a_short_queue_overflowing_is_congestion() {
    let mut link = LinkConfig::new(RTT, 100);
    link.queue = 25_000;
    let mut pair = pair(link, 1);
    let mut transfers = endless_stream(&mut pair);
    run_for(&mut pair, &mut transfers, Duration::from_secs(21));
    let u = utilization(&transfers, 30, 200, RATE);
    let stats = pair.link_stats(0);
    let dropped = stats.dropped_queue as f64 / stats.sent as f64;
    assert!(
        dropped < 0.06 && u >= 0.9,
        "{:.2} % dropped at the queue, utilization {u:.4}",
        dropped * 100.0
    );
}

/// A short dip of the bottleneck (a burst of cross traffic) leaves a queue behind when the
/// rate estimate, a maximum over ten rounds, outlasts it. The probe cycle's drain phase must
/// remove it: when it ended after one round, as the probe before it had added a round's
/// worth, a standing queue stayed for good.
#[test]
fn a_queue_left_by_a_short_dip_of_the_bottleneck_drains() {
    let mut pair = pair(LinkConfig::new(RTT, 100), 12);
    let mut transfers = endless_stream(&mut pair);
    run_for(&mut pair, &mut transfers, Duration::from_secs(5));
    pair.set_rate(0, RATE * 8 / 10);
    run_for(&mut pair, &mut transfers, 300 * MS);
    pair.set_rate(0, RATE);
    run_for(&mut pair, &mut transfers, Duration::from_secs(5));
    let mut samples = Vec::new();
    for _ in 0..500 {
        run_for(&mut pair, &mut transfers, 10 * MS);
        samples.push(pair.client().rtt().latest());
    }
    samples.sort();
    let queue = samples[samples.len() / 2].saturating_sub(RTT);
    let state = pair.client().stats().congestion;
    assert!(
        queue <= 5 * MS,
        "median queueing delay {queue:?}: {state:?}"
    );
    // And the link stays full.
    let u = utilization(&transfers, 110, 153, RATE);
    assert!(u >= 0.93, "utilization {u:.3}: {state:?}");
}

/// Two tunnels (two gateways with keys of their own, to the same far gateway) share one
/// bottleneck; the second starts 5 s after the first. The link stays full, and the shares
/// converge, slowly: 80/20 in the first 5 s, 57/40 forty seconds on (measured, Jain 0.97).
/// Both controllers' probes raise their estimates, the newcomer's by a larger fraction, and
/// congestion verdicts reset both to what they get; nothing drives convergence faster.
#[test]
fn two_tunnels_share_a_bottleneck() {
    let mut pair = pair(LinkConfig::new(RTT, 100), 13);
    let first_end = pair.connect_client(0);
    let mut first = Transfers::between(&pair, 0, first_end);
    first.start(&mut pair, 1 << 40);
    run_for(&mut pair, &mut first, Duration::from_secs(5));
    let client = pair.add_client();
    let second_end = pair.connect_client(client);
    let mut second = Transfers::between(&pair, client, second_end);
    second.start(&mut pair, 1 << 40);
    // Every byte read is checked against the generator as it arrives.
    let received = |t: &Transfers| t.by_id.values().map(|t| t.received).sum::<u64>();
    let joined = received(&first);
    let mut run = |pair: &mut Pair, seconds: u64| {
        let end = pair.now + Duration::from_secs(seconds);
        pair.run_until(Duration::from_secs(seconds + 1), |p| {
            first.pump(p);
            second.pump(p);
            p.now >= end
        });
        [received(&first), received(&second)]
    };
    let start = run(&mut pair, 5);
    let at_40 = run(&mut pair, 35);
    let at_45 = run(&mut pair, 5);
    let early = start[1] as f64 / (start[0] - joined + start[1]) as f64;
    assert!(early > 0.15, "the newcomer got {early:.3} of its first 5 s");
    let late: Vec<f64> = (0..2).map(|i| (at_45[i] - at_40[i]) as f64).collect();
    let jain = late.iter().sum::<f64>().powi(2) / (2.0 * late.iter().map(|x| x * x).sum::<f64>());
    let u = late.iter().sum::<f64>() / (RATE as f64 * 5.0);
    assert!(jain >= 0.95, "Jain {jain:.3} over 40-45 s: {late:?}");
    assert!(u >= 0.93, "utilization {u:.3} over 40-45 s");
}

/// The connection's counters count what their names say, checked against the simulated
/// links' own counts at 1 % loss each way: every packet and byte sent (data, ACK-only,
/// parity and the handshake), what arrived, and no more losses declared than the links
/// dropped, in the busy direction and the one that mostly acknowledges.
#[test]
fn the_counters_agree_with_the_links() {
    let link = LinkConfig::new(RTT, 100).with_loss(0.01);
    let mut pair = Pair::new(crate::test_epoch(), link.clone(), link, 31);
    pair.connect();
    let mut transfers = Transfers::new(0);
    transfers.start(&mut pair, 10_000_000);
    transfers.run(&mut pair, Duration::from_secs(60));
    transfers.verify();
    for (side, direction) in [(0usize, 0usize), (1, 1)] {
        let s = pair.sides[side].connection().stats();
        let out = pair.link_stats(direction);
        let back = pair.link_stats(1 - direction);
        assert_eq!(s.packets_sent, out.sent, "side {side}");
        assert_eq!(s.bytes_sent, out.sent_bytes, "side {side}");
        // One handshake packet (the initiation or the response) and the path MTU probes
        // besides these.
        assert_eq!(
            s.eliciting_sent + s.ack_only_sent + s.fec.parity_sent + 1 + s.mtu.probes_sent,
            s.packets_sent,
            "side {side}: {s:?}"
        );
        // Received: the packets that arrived and those rebuilt from parity; parity packets
        // are counted apart, and the handshake packet is the endpoint's.
        assert_eq!(
            s.packets_received - s.fec.recovered
                + s.fec.parity_received
                + s.replays
                + s.auth_failures
                + 1,
            back.delivered,
            "side {side}: {s:?}"
        );
        let dropped = out.dropped_loss + out.dropped_queue;
        assert!(
            s.packets_lost <= dropped,
            "side {side}: {} > {dropped}",
            s.packets_lost
        );
        // The loss read over the tracked packets is the link's, in the direction that
        // mostly acknowledges too: there, losses counted against data packets alone read
        // 20 % for a link that lost one packet in 142.
        let link_loss = dropped as f64 / out.sent as f64;
        assert!(
            (s.loss_ratio() - link_loss).abs() <= 0.005,
            "side {side}: read {:.4}, the link lost {link_loss:.4}: {s:?}",
            s.loss_ratio()
        );
    }
}
