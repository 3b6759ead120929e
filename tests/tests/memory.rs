//! The memory budget end to end. Fast clients upload through both gateways to a server that
//! stalls, then reads: the gateways' buffers fill to what their budget allows and no
//! further (peak RSS under the budget, the process itself included), the clients are held
//! back by TCP flow control, and every byte arrives once the server reads. And an idle
//! session costs less than the budget reckons for it. Needs root; run with
//! `cargo xtask test`.

// Test code: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use wsx_e2e::{Daemon, configs_with, digest, echo_server, pseudo_random, wait_for_tunnel};
use wsx_lab::{Node, addr};
use wsx_tunnel::SecretKey;

const SESSIONS: u64 = 64;
const BYTES: usize = 2 << 20;
const BUDGET_MIB: u64 = 48;
/// How long the server reads nothing after its first connection.
const STALL: Duration = Duration::from_secs(10);

#[test]
fn a_stalled_server_fills_the_gateways_only_to_their_budget_and_loses_nothing() {
    let lab = wsx_e2e::gateway_lab();
    let dir = wsx_e2e::config_dir(&lab);

    // The server: every connection waits out the stall, then reads to the end and reports
    // the digest of what it got.
    // Small receive buffers (inherited by each accepted socket): what the server does not
    // read stays in the gateways, not in its kernel.
    let listener: TcpListener = lab
        .run_in(Node::Server, || -> std::io::Result<TcpListener> {
            let socket = socket2::Socket::new(
                socket2::Domain::IPV4,
                socket2::Type::STREAM,
                Some(socket2::Protocol::TCP),
            )?;
            socket.set_recv_buffer_size(32 * 1024)?;
            socket.bind(&SocketAddr::new(addr::server(false), 0).into())?;
            socket.listen(256)?;
            Ok(socket.into())
        })
        .unwrap()
        .unwrap();
    let server_addr = listener.local_addr().unwrap();
    let (got_tx, got_rx) = mpsc::channel::<(u64, usize)>();
    std::thread::spawn(move || {
        let first = Arc::new(OnceLock::<Instant>::new());
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let first = first.clone();
            let got_tx = got_tx.clone();
            std::thread::spawn(move || {
                let start = *first.get_or_init(Instant::now);
                std::thread::sleep((start + STALL).saturating_duration_since(Instant::now()));
                let mut data = Vec::with_capacity(BYTES);
                if stream.read_to_end(&mut data).is_ok() {
                    let _ = got_tx.send((digest(&data), data.len()));
                }
            });
        }
    });

    let keys = (SecretKey::generate(), SecretKey::generate());
    let c = configs_with(&keys.0, &keys.1);
    let budget = format!("[sessions]\nmemory_budget_mib = {BUDGET_MIB}\n");
    let entry = SocketAddr::new(addr::GWA_LAN_V4.into(), 7300);
    let gw_a_config = c
        .gw_a
        .replace("[intercept]\ninterfaces = [\"lan0\"]\n", "")
        .replace("[sessions]\n", &budget)
        + &format!(
            "\n[[forward]]\nname = \"upload\"\nlisten = \"{entry}\"\nto = \"{server_addr}\"\npeer = \"gw-b\"\n"
        );
    let gw_b_config = c
        .gw_b
        .replace("[intercept]\ninterfaces = [\"lan0\"]\n", "")
        .replace("[sessions]\n", &budget);
    let gw_a = Daemon::start(&lab, Node::GwA, &dir, &gw_a_config);
    let gw_b = Daemon::start(&lab, Node::GwB, &dir, &gw_b_config);
    wait_for_tunnel(&gw_a, &gw_b, 1);
    // 48 MiB: a quarter for sessions, at 32 KiB each.
    let carried = gw_a.fields("memory budget carries");
    assert_eq!(carried.get("session_capacity"), Some(&384), "{carried:?}");

    // The clients: all at once, each as fast as its socket takes.
    let started = Instant::now();
    let sent: Vec<u64> = lab
        .run_in(Node::Client, move || {
            let clients: Vec<_> = (0..SESSIONS)
                .map(|i| {
                    std::thread::spawn(move || {
                        let data = pseudo_random(BYTES, i + 1);
                        let mut s =
                            TcpStream::connect_timeout(&entry, Duration::from_secs(5)).unwrap();
                        s.write_all(&data).unwrap();
                        s.shutdown(Shutdown::Write).unwrap();
                        // The server closes once it has read everything.
                        let mut rest = Vec::new();
                        s.read_to_end(&mut rest).unwrap();
                        digest(&data)
                    })
                })
                .collect();
            clients.into_iter().map(|c| c.join().unwrap()).collect()
        })
        .unwrap();
    let took = started.elapsed();

    let mut expected: HashMap<u64, usize> = HashMap::new();
    for d in sent {
        *expected.entry(d).or_default() += 1;
    }
    let mut arrived: HashMap<u64, usize> = HashMap::new();
    for _ in 0..SESSIONS {
        let (d, len) = got_rx.recv_timeout(Duration::from_secs(60)).unwrap();
        assert_eq!(len, BYTES);
        *arrived.entry(d).or_default() += 1;
    }
    assert_eq!(arrived, expected, "every upload arrived whole");
    assert!(
        took >= STALL,
        "the clients were held back by the stall ({took:?})"
    );

    // Seen: gw-a 39.7 MiB, gw-b 34.2 MiB; with a 4 GiB budget (the tunnels' own 64 MiB
    // windows), gw-b peaked at 62.4 MiB.
    let budget_kib = BUDGET_MIB * 1024;
    for (name, gw) in [("gw-a", &gw_a), ("gw-b", &gw_b)] {
        let peak = gw.max_rss_kb();
        eprintln!("{name}: peak RSS {peak} KiB (budget {budget_kib} KiB)");
        assert!(
            peak < budget_kib,
            "{name} peaked at {peak} KiB, over its {budget_kib} KiB budget"
        );
    }
}

/// A thousand sessions, each echoed once and then idle: each gateway's peak RSS grows by
/// less than [`wsx_proxy::MemoryBudget::PER_SESSION`] per session.
#[test]
fn an_idle_session_costs_less_than_the_budget_reckons() {
    const IDLE: usize = 1000;
    let lab = wsx_e2e::gateway_lab();
    let dir = wsx_e2e::config_dir(&lab);
    let server_addr = echo_server(&lab);
    let keys = (SecretKey::generate(), SecretKey::generate());
    let c = configs_with(&keys.0, &keys.1);
    let entry = SocketAddr::new(addr::GWA_LAN_V4.into(), 7301);
    let gw_a_config = c.gw_a.replace("[intercept]\ninterfaces = [\"lan0\"]\n", "")
        + &format!(
            "\n[[forward]]\nname = \"echo\"\nlisten = \"{entry}\"\nto = \"{server_addr}\"\npeer = \"gw-b\"\n"
        );
    let gw_b_config = c.gw_b.replace("[intercept]\ninterfaces = [\"lan0\"]\n", "");
    let gw_a = Daemon::start(&lab, Node::GwA, &dir, &gw_a_config);
    let gw_b = Daemon::start(&lab, Node::GwB, &dir, &gw_b_config);
    wait_for_tunnel(&gw_a, &gw_b, 1);
    // A few sessions first, so that what the first ones bring (the runtime's threads and
    // pools) is not counted against the idle ones.
    let warm = |n: usize| {
        lab.run_in(Node::Client, move || {
            (0..n)
                .map(|i| {
                    let mut s = TcpStream::connect_timeout(&entry, Duration::from_secs(5))?;
                    s.set_read_timeout(Some(Duration::from_secs(10)))?;
                    let byte = [i as u8];
                    s.write_all(&byte)?;
                    let mut echo = [0u8; 1];
                    s.read_exact(&mut echo)?;
                    assert_eq!(echo, byte);
                    Ok(s)
                })
                .collect::<std::io::Result<Vec<TcpStream>>>()
        })
        .unwrap()
        .unwrap()
    };
    let first = warm(50);
    let before = [gw_a.max_rss_kb(), gw_b.max_rss_kb()];
    let idle = warm(IDLE);
    assert_eq!(gw_a.sessions("tunnel"), 50 + IDLE);
    let after = [gw_a.max_rss_kb(), gw_b.max_rss_kb()];
    let limit = wsx_proxy::MemoryBudget::PER_SESSION / 1024;
    for (i, name) in ["gw-a", "gw-b"].into_iter().enumerate() {
        let per_session = (after[i] - before[i]) / IDLE as u64;
        eprintln!(
            "{name}: {per_session} KiB per idle session ({} -> {} KiB)",
            before[i], after[i]
        );
        assert!(
            per_session < limit,
            "{name}: {per_session} KiB per idle session"
        );
    }
    drop((first, idle));
}
