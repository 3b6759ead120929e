//! Hostile input: nothing forged, truncated, replayed or out of place gets in, panics, or
//! draws an answer.

use crate::testing::{LinkConfig, Pair, Transfers};
use crate::{Endpoint, EndpointConfig, Event, SecretKey};
use std::time::Duration;

fn clean_pair(seed: u64) -> Pair {
    // No bottleneck queue: injected datagrams must all reach the endpoint.
    let link = LinkConfig {
        rate: None,
        ..LinkConfig::new(Duration::from_millis(20), 100)
    };
    let mut pair = Pair::new(crate::test_epoch(), link.clone(), link, seed);
    pair.connect();
    pair
}

/// Records every datagram the client sends (what an attacker on the path sees).
fn capture(pair: &mut Pair, transfers: &mut Transfers, duration: Duration) -> Vec<Vec<u8>> {
    let mut seen = Vec::new();
    let end = pair.now + duration;
    while pair.now < end {
        transfers.pump(pair);
        assert!(pair.step_with(&mut |to, d| {
            if to == 1 {
                seen.push(d.to_vec());
            }
        }));
    }
    seen
}

/// Replayed, truncated, bit-flipped and forged data packets are dropped without effect: the
/// transfer completes intact, the server answers none of them, and the counters say why.
#[test]
fn replayed_truncated_and_forged_packets_are_dropped_silently() {
    let mut pair = clean_pair(21);
    let mut transfers = Transfers::new(0);
    transfers.start(&mut pair, 2_000_000);
    let captured = capture(&mut pair, &mut transfers, Duration::from_millis(300));
    assert!(captured.len() > 50);
    let answers_before = pair.server().stats().packets_sent;
    let mut rng = fastrand::Rng::with_seed(5);
    for datagram in captured.iter().take(200) {
        // Replay as is.
        pair.inject(0, datagram);
        // Truncations at every interesting length.
        for cut in [0, 1, 5, 12, 13, 28, 29, datagram.len() - 1] {
            pair.inject(0, &datagram[..cut.min(datagram.len())]);
        }
        // A flipped bit anywhere.
        let mut flipped = datagram.clone();
        let at = rng.usize(..flipped.len());
        flipped[at] ^= 1 << rng.u8(..8);
        pair.inject(0, &flipped);
        // Random bytes behind a valid header.
        let mut forged = datagram.clone();
        rng.fill(&mut forged[13..]);
        pair.inject(0, &forged);
    }
    let end = pair.now + Duration::from_millis(30);
    while pair.now < end {
        transfers.pump(&mut pair);
        pair.step();
    }
    let stats = pair.server().stats();
    // Each of the 200 captured packets came back replayed, flipped and forged (truncated ones
    // too short for a tag are dropped before any counter): all refused, by the replay window
    // when the packet number was already seen (checked first, it is cheaper), else by the
    // AEAD.
    assert!(stats.replays + stats.auth_failures >= 600, "{stats:?}");
    assert!(stats.replays >= 200, "{stats:?}");
    // Nothing was answered beyond what the real traffic needed: the ACK rate did not jump.
    let answers = pair.server().stats().packets_sent - answers_before;
    assert!(answers < 20, "{answers} packets sent in answer");
    transfers.run(&mut pair, Duration::from_secs(30));
    transfers.verify();
    assert!(pair.client().is_established() && pair.server().is_established());
}

/// Handshake initiations that are replayed, come from unknown keys, are truncated or are
/// garbage get no answer and create no connection; a response arriving out of place is
/// ignored.
#[test]
fn bad_handshakes_get_no_answer() {
    let t0 = crate::test_epoch();
    let server_key = SecretKey::from_bytes([2; 32]);
    let client_key = SecretKey::from_bytes([1; 32]);
    let stranger = SecretKey::from_bytes([3; 32]);
    let peers = vec![client_key.public_key()];
    let mut server = Endpoint::new(EndpointConfig::new(server_key.clone(), peers, 1));
    let from = "[fd00::1]:4000".parse().expect("literal");
    let to = "[fd00::2]:4000".parse().expect("literal");
    let unix = Duration::from_secs(1_800_000_000);
    let mut buf = vec![0u8; 64 * 1024];

    let initiation = |key: &SecretKey, unix: Duration, buf: &mut Vec<u8>| {
        let mut config = EndpointConfig::new(key.clone(), vec![server_key.public_key()], 9);
        config.transport = Default::default();
        let mut client = Endpoint::new(config);
        let (_, mut conn) = client
            .connect(t0, unix, to, server_key.public_key())
            .expect("configured peer");
        let t = conn.poll_transmit(t0, buf).expect("an initiation");
        buf[..t.size].to_vec()
    };

    // A valid initiation is answered once, with something no larger.
    let good = initiation(&client_key, unix, &mut buf);
    match server.handle(t0, from, &good) {
        Some(crate::DatagramEvent::NewConnection {
            mut connection,
            replaces,
            ..
        }) => {
            assert!(replaces.is_none());
            let t = connection
                .poll_transmit(t0, &mut buf)
                .expect("the response");
            assert!(
                t.size <= good.len(),
                "response {} > request {}",
                t.size,
                good.len()
            );
        }
        other => panic!("expected a new connection, got {other:?}"),
    }
    // Replayed: refused.
    assert!(server.handle(t0, from, &good).is_none());
    // An older timestamp: refused.
    let old = initiation(&client_key, unix - Duration::from_secs(1), &mut buf);
    assert!(server.handle(t0, from, &old).is_none());
    // An unknown key: refused.
    let strange = initiation(&stranger, unix + Duration::from_secs(1), &mut buf);
    assert!(server.handle(t0, from, &strange).is_none());
    // Truncated and corrupted copies of a fresh one: refused, no panic.
    let fresh = initiation(&client_key, unix + Duration::from_secs(2), &mut buf);
    for cut in 0..fresh.len() {
        assert!(
            server.handle(t0, from, &fresh[..cut]).is_none(),
            "cut {cut}"
        );
    }
    for i in 0..fresh.len() {
        let mut bad = fresh.clone();
        bad[i] ^= 0x40;
        assert!(server.handle(t0, from, &bad).is_none(), "flip at {i}");
    }
    let stats = server.stats();
    assert_eq!(stats.handshakes_accepted, 1);
    assert_eq!(stats.handshakes_replayed, 2);
    // The fresh one still works afterwards: the failures left no state behind.
    assert!(matches!(
        server.handle(t0, from, &fresh),
        Some(crate::DatagramEvent::NewConnection {
            replaces: Some(_),
            ..
        })
    ));
    // Shutting down: even a valid, newer initiation gets no answer.
    server.refuse_new();
    let later = initiation(&client_key, unix + Duration::from_secs(3), &mut buf);
    assert!(server.handle(t0, from, &later).is_none());
    assert_eq!(server.stats().handshakes_accepted, 2);
}

/// Where the log goes in [`ignored_initiations_are_logged_sparingly`].
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An operator whose peer is misconfigured learns why at info, once per ten seconds with
/// the count in between, not once per retry: initiations from a key that is not a peer's,
/// and initiations made with another public key for this gateway.
#[test]
fn ignored_initiations_are_logged_sparingly() {
    let t0 = crate::test_epoch();
    let server_key = SecretKey::from_bytes([2; 32]);
    let stranger = SecretKey::from_bytes([3; 32]);
    let mut server = Endpoint::new(EndpointConfig::new(
        server_key.clone(),
        vec![SecretKey::from_bytes([1; 32]).public_key()],
        1,
    ));
    let from = "[fd00::1]:4000".parse().expect("literal");
    let to = "[fd00::2]:4000".parse().expect("literal");
    let mut buf = vec![0u8; 64 * 1024];
    let mut initiation = |key: &SecretKey, server: &crate::PublicKey, second: u64| {
        let mut client = Endpoint::new(EndpointConfig::new(key.clone(), vec![*server], 9));
        let unix = Duration::from_secs(1_800_000_000 + second);
        let (_, mut conn) = client.connect(t0, unix, to, *server).expect("peer");
        let t = conn.poll_transmit(t0, &mut buf).expect("an initiation");
        buf[..t.size].to_vec()
    };
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        // A stranger retrying every second for three seconds, then once more 11 s later.
        for second in 0..3 {
            let datagram = initiation(&stranger, &server_key.public_key(), second);
            let at = t0 + Duration::from_secs(second);
            assert!(server.handle(at, from, &datagram).is_none());
        }
        let datagram = initiation(&stranger, &server_key.public_key(), 11);
        assert!(
            server
                .handle(t0 + Duration::from_secs(13), from, &datagram)
                .is_none()
        );
        // A peer that has another key for this gateway, 11 s after that.
        let wrong = SecretKey::from_bytes([4; 32]).public_key();
        let datagram = initiation(&SecretKey::from_bytes([1; 32]), &wrong, 30);
        assert!(
            server
                .handle(t0 + Duration::from_secs(24), from, &datagram)
                .is_none()
        );
    });
    let log =
        String::from_utf8_lossy(&captured.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 3, "{log}");
    assert!(
        lines[0].contains("not one of this gateway's peers"),
        "{log}"
    );
    assert!(lines[0].contains("ignored_since_last=0"), "{log}");
    assert!(lines[1].contains("ignored_since_last=2"), "{log}");
    assert!(lines[2].contains("cannot read"), "{log}");
    assert_eq!(server.stats().handshakes_rejected, 5);
}

/// A handshake response that arrives twice, or after the connection is established, changes
/// nothing.
#[test]
fn a_duplicated_handshake_response_is_ignored() {
    let mut link = LinkConfig::new(Duration::from_millis(20), 100);
    link.duplicate = 1.0;
    let mut pair = Pair::new(crate::test_epoch(), link.clone(), link, 22);
    pair.connect();
    let mut transfers = Transfers::new(0);
    transfers.start(&mut pair, 500_000);
    transfers.run(&mut pair, Duration::from_secs(10));
    transfers.verify();
    assert_eq!(pair.sides[0].connections.len(), 1);
    assert_eq!(pair.sides[1].connections.len(), 1);
}

/// The handshake messages are padded to the base datagram size (1,200 bytes), which every
/// path must carry: a path that does not fails the handshake (a gateway then reports the
/// peer down and bypasses it) instead of establishing a tunnel whose packets vanish. Above
/// it, the connection comes up and path MTU discovery finds the rest.
#[test]
fn a_path_below_the_base_datagram_size_fails_the_handshake() {
    let base = usize::from(crate::connection::BASE_DATAGRAM);
    for (limit, connects) in [(base, true), (base - 1, false)] {
        let mut link = LinkConfig::new(Duration::from_millis(20), 100);
        link.max_datagram = Some(limit);
        let mut pair = Pair::new(crate::test_epoch(), link.clone(), link, 3);
        pair.initiate(0);
        let mut sizes = Vec::new();
        let end = pair.now + Duration::from_secs(20);
        while pair.now < end && pair.step_with(&mut |_, d| sizes.push(d.len())) {}
        // A failed handshake's connection may be gone by the end.
        let established = pair.sides[0]
            .connections
            .values()
            .any(|c| c.is_established());
        assert_eq!(
            established, connects,
            "path limit {limit}, datagrams {sizes:?}"
        );
        if connects {
            // Initiation and response, each exactly the base size.
            assert_eq!(sizes[..2], [base, base]);
        } else {
            assert!(pair.link_stats(0).dropped_too_big > 0);
        }
    }
}

/// The whole link goes dark for five seconds under a bulk transfer, then comes back: the
/// full-size packets lost meanwhile went with everything else, so the connection carries on
/// (no black hole declared) and the transfer completes intact.
#[test]
fn an_outage_is_not_a_black_hole() {
    let link = LinkConfig::new(Duration::from_millis(40), 100);
    let mut pair = Pair::new(crate::test_epoch(), link.clone(), link, 15);
    pair.connect();
    let mut transfers = Transfers::new(0);
    transfers.start(&mut pair, 60_000_000);
    let warm = pair.now + Duration::from_secs(2);
    pair.run_until(Duration::from_secs(3), |p| {
        transfers.pump(p);
        p.now >= warm
    });
    for direction in [0, 1] {
        pair.set_max_datagram(direction, Some(0));
    }
    let back = pair.now + Duration::from_secs(5);
    pair.run_until(Duration::from_secs(6), |p| {
        transfers.pump(p);
        p.now >= back
    });
    for direction in [0, 1] {
        pair.set_max_datagram(direction, None);
    }
    let lost = |p: &Pair| {
        p.sides.iter().any(|s| {
            s.events
                .iter()
                .any(|(_, e)| matches!(e, Event::ConnectionLost(_)))
        })
    };
    pair.run_until(Duration::from_secs(60), |p| {
        assert!(!lost(p), "the connection ended after the outage");
        transfers.pump(p);
        transfers.all_complete()
    });
    transfers.verify();
}
