//! Out of descriptors: a gateway whose open-file limit is far below what its sessions need
//! refuses new connections at once (a reset, not a wait in the backlog), keeps the sessions
//! it has, warns a bounded number of times, and serves again once sessions end. Needs
//! root; run with `cargo xtask test`.

// Test code: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use wsx_e2e::{Daemon, configs_with, echo_server};
use wsx_lab::{Node, addr};
use wsx_tunnel::SecretKey;

/// One session: connects through `entry`, sends a byte and waits for its echo. `Ok(stream)`
/// when echoed, `Err(kind)` when refused, with how long it took either way.
fn session(entry: SocketAddr) -> (Result<TcpStream, ErrorKind>, Duration) {
    let started = Instant::now();
    let attempt = || -> std::io::Result<TcpStream> {
        let mut s = TcpStream::connect_timeout(&entry, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(b"x")?;
        let mut byte = [0u8; 1];
        if s.read(&mut byte)? == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        Ok(s)
    };
    let result = attempt().map_err(|e| e.kind());
    (result, started.elapsed())
}

#[test]
fn out_of_descriptors_new_connections_are_refused_at_once() {
    let lab = wsx_e2e::gateway_lab();
    let dir = wsx_e2e::config_dir(&lab);
    let server_addr = echo_server(&lab);
    // gw-a alone, its peer never up: a forwarding listener's sessions bypass to the server,
    // two descriptors each, under a limit of 96 open files.
    let entry = SocketAddr::new(addr::GWA_LAN_V4.into(), 7100);
    let c = configs_with(&SecretKey::generate(), &SecretKey::generate());
    let config = c.gw_a.replace("[intercept]\ninterfaces = [\"lan0\"]\n", "")
        + &format!(
            "\n[[forward]]\nname = \"echo\"\nlisten = \"{entry}\"\nto = \"{server_addr}\"\npeer = \"gw-b\"\n"
        );
    let gw_a = Daemon::start_with_descriptor_limit(&lab, Node::GwA, &dir, &config, 96);
    gw_a.wait_for("session_capacity", Duration::from_secs(5));

    let outcomes: Vec<(Result<TcpStream, ErrorKind>, Duration)> = lab
        .run_in(Node::Client, move || {
            (0..80).map(|_| session(entry)).collect()
        })
        .unwrap();
    let served = outcomes.iter().filter(|(r, _)| r.is_ok()).count();
    let refused: Vec<(ErrorKind, Duration)> = outcomes
        .iter()
        .filter_map(|(r, took)| r.as_ref().err().map(|kind| (*kind, *took)))
        .collect();
    assert!(served >= 10, "only {served} sessions before the limit");
    assert!(!refused.is_empty(), "80 sessions fit in 96 descriptors?");
    for (kind, took) in &refused {
        assert!(
            *took < Duration::from_secs(2),
            "a refusal took {took:?} ({kind:?}): it waited instead"
        );
    }
    // Every session that was served still echoes.
    let mut held: Vec<TcpStream> = outcomes.into_iter().filter_map(|(r, _)| r.ok()).collect();
    for s in &mut held {
        s.write_all(b"y").unwrap();
        let mut byte = [0u8; 1];
        assert_eq!(s.read(&mut byte).unwrap(), 1);
    }
    // Refused before they took more descriptors (no session failed halfway for want of
    // one), and warned, not once per refusal.
    assert_eq!(gw_a.count("Too many open files"), 0);
    let warnings = gw_a.count("at capacity (open files or memory budget)");
    assert!(
        (1..=3).contains(&warnings),
        "{warnings} warnings for {} refusals",
        refused.len()
    );
    // The sessions end: new ones are served again, once their descriptors are closed (the
    // ends' FINs cross the WAN first; a busy machine may take a while).
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (again, _) = lab.run_in(Node::Client, move || session(entry)).unwrap();
        if again.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "still refused: {again:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Transparent interception at capacity fails open: once the sessions fill what the
/// open-file limit carries, gw-a stops intercepting and new connections take the kernel's
/// route to the server, unaccelerated but served; when sessions end, it intercepts again.
#[test]
fn at_capacity_interception_pauses_and_connections_go_direct() {
    let lab = wsx_e2e::gateway_lab();
    let dir = wsx_e2e::config_dir(&lab);
    let server_addr = echo_server(&lab);
    let c = configs_with(&SecretKey::generate(), &SecretKey::generate());
    // 96 open files: 32 for sessions, one each through the tunnel; interception paused
    // from 29.
    let gw_a = Daemon::start_with_descriptor_limit(&lab, Node::GwA, &dir, &c.gw_a, 96);
    let gw_b = Daemon::start(&lab, Node::GwB, &dir, &c.gw_b);
    wsx_e2e::wait_for_tunnel(&gw_a, &gw_b, 1);

    let wave = |n: usize| -> Vec<TcpStream> {
        let outcomes: Vec<(Result<TcpStream, ErrorKind>, Duration)> = lab
            .run_in(Node::Client, move || {
                (0..n).map(|_| session(server_addr)).collect()
            })
            .unwrap();
        outcomes.into_iter().filter_map(|(r, _)| r.ok()).collect()
    };
    // Fill it: some are refused while it is full and before the rules change.
    let mut held = wave(40);
    assert!(held.len() >= 10, "only {} sessions", held.len());
    gw_a.wait_for(
        "at capacity: new connections are not intercepted",
        Duration::from_secs(5),
    );
    let opened = gw_a.count("session opened");
    // Past capacity: every new connection is served, directly.
    let direct = wave(20);
    assert_eq!(
        direct.len(),
        20,
        "connections past capacity were not all served"
    );
    assert_eq!(
        gw_a.count("session opened"),
        opened,
        "gw-a intercepted past capacity"
    );
    held.extend(direct);
    for s in &mut held {
        s.write_all(b"z").unwrap();
        let mut byte = [0u8; 1];
        assert_eq!(s.read(&mut byte).unwrap(), 1);
    }
    // Sessions end: it intercepts again.
    drop(held);
    gw_a.wait_for(
        "below capacity: intercepting again",
        Duration::from_secs(10),
    );
    let again = wave(1);
    assert_eq!(again.len(), 1);
    gw_a.wait_for_count("session opened", opened + 1, Duration::from_secs(10));
    assert_eq!(gw_a.count("session opened"), opened + 1);
}
