//! Forward error correction between two endpoints (PROTOCOL.md §5.1): what it repairs, what
//! it costs, and that it never hides a loss from the congestion controller.

use super::simulation::{pair_with, run_for};
use crate::testing::{LinkConfig, Transfers};
use crate::{ConnectionStats, FecMode, TransportConfig};
use std::time::Duration;

const RTT: Duration = Duration::from_millis(100);

/// One bulk stream over 100 Mbit/s, 100 ms, `forward` impairments; the sender's and the
/// receiver's counters after a 3 s start, then after `seconds` more.
fn bulk(
    forward: LinkConfig,
    mode: FecMode,
    seconds: u64,
) -> [(ConnectionStats, ConnectionStats); 2] {
    let config = TransportConfig {
        fec: mode,
        ..TransportConfig::default()
    };
    let mut pair = pair_with(forward, 21, config);
    let mut transfers = Transfers::new(0);
    transfers.start(&mut pair, 1 << 40);
    run_for(&mut pair, &mut transfers, Duration::from_secs(3));
    let start = (pair.client().stats(), pair.server().stats());
    run_for(&mut pair, &mut transfers, Duration::from_secs(seconds));
    let end = (pair.client().stats(), pair.server().stats());
    [start, end]
}

#[test]
fn one_percent_random_loss_is_repaired_without_retransmission() {
    let [(s0, r0), (s1, r1)] = bulk(
        LinkConfig::new(RTT, 100).with_loss(0.01),
        FecMode::Adaptive,
        10,
    );
    let recovered = s1.fec.recovered_by_peer - s0.fec.recovered_by_peer;
    let retransmitted = s1.packets_lost - s0.packets_lost;
    let share = recovered as f64 / (recovered + retransmitted) as f64;
    assert!(
        share >= 0.95,
        "recovered {recovered}, lost {retransmitted}: {s1:#?}"
    );
    assert_eq!(
        r1.fec.recovered - r0.fec.recovered,
        recovered,
        "both ends agree"
    );
    let parity = s1.fec.parity_sent - s0.fec.parity_sent;
    let data = s1.eliciting_sent - s0.eliciting_sent;
    let overhead = parity as f64 / data as f64;
    assert!(overhead <= 0.10, "overhead {overhead:.3}: {s1:#?}");
    // Every repaired loss still reached the controller as a loss.
    let c0 = s0.congestion.expect("adaptive");
    let c1 = s1.congestion.expect("adaptive");
    assert!(
        c1.random_losses - c0.random_losses + (c1.congestion_events - c0.congestion_events)
            >= recovered,
        "{c1:?}"
    );
}

#[test]
fn a_clean_path_costs_less_than_one_percent() {
    let [(s0, _), (s1, _)] = bulk(LinkConfig::new(RTT, 100), FecMode::Adaptive, 10);
    let parity = s1.fec.parity_bytes_sent - s0.fec.parity_bytes_sent;
    let bytes = s1.bytes_sent - s0.bytes_sent;
    assert!(
        (parity as f64) <= 0.01 * bytes as f64,
        "parity {parity} of {bytes}: {s1:#?}"
    );
}

#[test]
fn fec_off_sends_no_parity_and_on_sends_it_on_a_clean_path() {
    let [_, (off, _)] = bulk(LinkConfig::new(RTT, 100).with_loss(0.01), FecMode::Off, 2);
    assert_eq!(off.fec.parity_sent, 0);
    assert_eq!(off.fec.packets_protected, 0);
    let [(on0, _), (on, _)] = bulk(LinkConfig::new(RTT, 100), FecMode::On, 2);
    let data = on.eliciting_sent - on0.eliciting_sent;
    assert_eq!(on.fec.packets_protected - on0.fec.packets_protected, data);
    assert!(on.fec.parity_sent > on0.fec.parity_sent);
}

/// Bursts (Gilbert-Elliott, mean burst 3, about 1 % loss): interleaving spreads them, and
/// what it cannot repair is counted, not hidden.
#[test]
fn burst_loss_is_interleaved_or_reported() {
    let mut link = LinkConfig::new(RTT, 100);
    link.burst = Some((0.0034, 0.33));
    let [(s0, r0), (s1, r1)] = bulk(link, FecMode::Adaptive, 10);
    let recovered = s1.fec.recovered_by_peer - s0.fec.recovered_by_peer;
    let lost = s1.packets_lost - s0.packets_lost;
    let share = recovered as f64 / (recovered + lost) as f64;
    let unrecoverable = r1.fec.unrecoverable_groups - r0.fec.unrecoverable_groups;
    eprintln!(
        "bursts: recovered {recovered}, retransmitted {lost}, unrecoverable groups {unrecoverable}"
    );
    // Measured: 70 % of burst losses repaired at this burst length (the rest retransmitted,
    // and every group that could not be repaired counted).
    assert!(share >= 0.6, "recovered {recovered}, lost {lost}: {s1:#?}");
    assert!(
        lost == 0 || unrecoverable > 0,
        "unrepaired losses not reported"
    );
}

/// The per-peer setting changes on a live connection: adaptive to off stops parity from the
/// next block, and back to adaptive starts it again under loss.
#[test]
fn fec_mode_changes_on_a_running_connection() {
    let config = TransportConfig {
        fec: FecMode::Adaptive,
        ..TransportConfig::default()
    };
    let mut pair = pair_with(LinkConfig::new(RTT, 100).with_loss(0.01), 22, config);
    let mut transfers = Transfers::new(0);
    transfers.start(&mut pair, 1 << 40);
    run_for(&mut pair, &mut transfers, Duration::from_secs(4));
    let adaptive = pair.client().stats().fec;
    assert!(adaptive.parity_sent > 0, "{adaptive:?}");

    pair.client().set_fec(FecMode::Off, 0.25);
    // The block open at the switch still gets its parity.
    run_for(&mut pair, &mut transfers, Duration::from_millis(50));
    let switched = pair.client().stats().fec;
    run_for(&mut pair, &mut transfers, Duration::from_secs(2));
    let off = pair.client().stats().fec;
    assert_eq!(
        (off.parity_sent, off.packets_protected),
        (switched.parity_sent, switched.packets_protected)
    );

    pair.client().set_fec(FecMode::Adaptive, 0.25);
    run_for(&mut pair, &mut transfers, Duration::from_secs(2));
    let again = pair.client().stats().fec;
    assert!(again.parity_sent > off.parity_sent, "{again:?}");
    assert!(again.recovered_by_peer > off.recovered_by_peer, "{again:?}");
}
