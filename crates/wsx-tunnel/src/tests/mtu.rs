//! Path MTU discovery between two endpoints (PROTOCOL.md §5.2): the datagram size climbs to
//! what the path carries, follows it down when it shrinks under a live connection, and FEC
//! keeps repairing across the change.

use super::simulation::pair_with;
use crate::connection::BASE_DATAGRAM;
use crate::testing::{LinkConfig, Pair, Transfers};
use crate::{Event, FecMode, TransportConfig};
use std::time::Duration;

const RTT: Duration = Duration::from_millis(100);

/// A transfer of `bytes` from the client over a 100 Mbit/s, 100 ms path that carries
/// datagrams up to `path` bytes (the reverse path too).
fn pair_over(path: usize, config: TransportConfig, seed: u64) -> Pair {
    let mut forward = LinkConfig::new(RTT, 100);
    forward.max_datagram = Some(path);
    let mut pair = pair_with(forward, seed, config);
    pair.set_max_datagram(1, Some(path));
    pair
}

/// Runs the transfers until `done` or `limit`, failing if either side loses the connection.
fn run(
    pair: &mut Pair,
    transfers: &mut Transfers,
    limit: Duration,
    mut done: impl FnMut(&mut Pair, &Transfers) -> bool,
) {
    pair.run_until(limit, |p| {
        let lost = p
            .sides
            .iter()
            .flat_map(|s| &s.events)
            .find(|(_, e)| matches!(e, Event::ConnectionLost(_)));
        assert!(lost.is_none(), "{lost:?}");
        transfers.pump(p);
        done(p, transfers)
    });
}

#[test]
fn the_datagram_size_climbs_to_what_the_path_carries() {
    // Ethernet and jumbo frames over IPv6 (the simulation's addresses), found exactly; a
    // 1420-byte MTU (a WireGuard-like tunnel on the way) within the search's granularity.
    for (path, lowest, seed) in [(1452, 1452, 31), (8952, 8952, 32), (1372, 1372 - 16, 33)] {
        let mut pair = pair_over(path, TransportConfig::default(), seed);
        assert_eq!(pair.client().stats().datagram_size, BASE_DATAGRAM);
        let mut transfers = Transfers::new(0);
        transfers.start(&mut pair, 30_000_000);
        let start = pair.now;
        let mut found = None;
        run(
            &mut pair,
            &mut transfers,
            Duration::from_secs(60),
            |p, t| {
                let size = usize::from(p.client().stats().datagram_size);
                assert!(size <= path, "{size} sent over a {path}-byte path");
                if found.is_none() && size >= lowest {
                    found = Some(p.now - start);
                }
                t.all_complete()
            },
        );
        transfers.verify();
        let stats = pair.client().stats();
        let found = found.unwrap_or_else(|| panic!("{path}: stuck at {}", stats.datagram_size));
        // The usual sizes are tried together in the first round trip; an odd one takes a
        // binary search, one probe size per round trip (a size that does not fit takes
        // three lost probes to give up).
        let rounds = found.as_secs_f64() / RTT.as_secs_f64();
        let most = if path == lowest { 3.0 } else { 25.0 };
        assert!(rounds <= most, "{path}: {rounds:.1} round trips");
        // Probes are not the line's losses: the controller heard of the packets the queue
        // dropped (the start overshoots it), none of the probes the path dropped.
        let link = pair.link_stats(0);
        let heard = stats.congestion.expect("adaptive").losses;
        assert_eq!(
            heard,
            stats.packets_lost + stats.fec.recovered_by_peer,
            "{path}: {stats:#?}"
        );
        assert!(
            stats.packets_lost <= link.dropped_queue + link.dropped_loss,
            "{path}: {link:?}"
        );
        assert!(
            link.dropped_too_big > 0,
            "{path}: no probe was too big: {link:?}"
        );
        eprintln!(
            "{path}: {} after {rounds:.1} RTT, {:?}",
            stats.datagram_size, stats.mtu
        );
    }
}

#[test]
fn a_shrinking_path_is_followed_without_ending_the_connection() {
    let mut pair = pair_over(1452, TransportConfig::default(), 34);
    let mut transfers = Transfers::new(0);
    transfers.start(&mut pair, 80_000_000);
    run(&mut pair, &mut transfers, Duration::from_secs(3), |p, _| {
        p.now >= p.epoch + Duration::from_secs(2)
    });
    assert_eq!(pair.client().stats().datagram_size, 1452);
    // A tunnel appears on the way: a 1350-byte MTU, 1,302 bytes of UDP payload.
    pair.set_max_datagram(0, Some(1302));
    let shrunk = pair.now;
    let mut followed = None;
    run(
        &mut pair,
        &mut transfers,
        Duration::from_secs(60),
        |p, t| {
            if followed.is_none() && p.client().stats().datagram_size <= 1302 {
                followed = Some(p.now - shrunk);
            }
            t.all_complete()
        },
    );
    transfers.verify();
    let stats = pair.client().stats();
    let followed = followed.expect("the size never came down");
    assert!(
        followed <= Duration::from_secs(2),
        "followed after {followed:?}"
    );
    assert!(
        (1302 - 16..=1302).contains(&usize::from(stats.datagram_size)),
        "{stats:#?}"
    );
    assert_eq!(stats.mtu.black_holes, 1, "{stats:#?}");
    // The packets too large for the new path were not taken for congestion.
    let congestion = stats.congestion.expect("adaptive").congestion_events;
    assert!(
        congestion <= 2,
        "{congestion} congestion events: {stats:#?}"
    );
}

#[test]
fn fec_repairs_across_a_change_of_datagram_size() {
    let config = TransportConfig {
        fec: FecMode::On,
        ..TransportConfig::default()
    };
    let mut forward = LinkConfig::new(RTT, 100).with_loss(0.01);
    forward.max_datagram = Some(1452);
    let mut pair = pair_with(forward, 35, config);
    let mut transfers = Transfers::new(0);
    transfers.start(&mut pair, 60_000_000);
    run(&mut pair, &mut transfers, Duration::from_secs(4), |p, _| {
        p.now >= p.epoch + Duration::from_secs(3)
    });
    let before = pair.server().stats().fec.recovered;
    assert!(before > 0, "nothing repaired at 1,452 bytes");
    pair.set_max_datagram(0, Some(1302));
    let shrunk = pair.now;
    let mut after_change = None;
    run(
        &mut pair,
        &mut transfers,
        Duration::from_secs(60),
        |p, t| {
            let size = p.client().stats().datagram_size;
            if after_change.is_none() && size <= 1302 && p.now > shrunk + Duration::from_secs(3) {
                after_change = Some(p.server().stats().fec.recovered);
            }
            t.all_complete()
        },
    );
    transfers.verify();
    let after_change = after_change.expect("the transfer ended too soon");
    let recovered = pair.server().stats().fec.recovered;
    assert!(
        recovered > after_change,
        "nothing repaired at the smaller size: {:#?}",
        pair.server().stats()
    );
}

/// On a short path the receiver holds its ACKs longer than the RTT (5 ms at least): the
/// sender must not take the wait for a black hole and build small packets meanwhile.
#[test]
fn delayed_acks_on_a_short_path_are_not_a_black_hole() {
    let mut forward = LinkConfig::new(Duration::from_millis(2), 100);
    forward.max_datagram = Some(1452);
    let mut pair = pair_with(forward, 36, TransportConfig::default());
    let mut transfers = Transfers::new(0);
    transfers.start(&mut pair, 40_000_000);
    run(
        &mut pair,
        &mut transfers,
        Duration::from_secs(30),
        |_, t| t.all_complete(),
    );
    transfers.verify();
    let stats = pair.client().stats();
    assert_eq!(stats.datagram_size, 1452);
    assert_eq!(stats.mtu.black_holes, 0, "{stats:#?}");
    // Nearly every data packet is full-size: the stream's last and the first round trip's
    // are the exceptions.
    let link = pair.link_stats(0);
    let mean = link.sent_bytes / link.sent;
    eprintln!("mean datagram {mean} bytes");
    assert!(mean >= 1440, "mean datagram {mean} bytes: {stats:#?}");
}
