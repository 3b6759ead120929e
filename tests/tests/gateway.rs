//! The wsx gateway end to end: client → gw-a (wsx) → emulated WAN → gw-b (wsx) → server,
//! with real kernel TCP, real nftables TPROXY rules and the `wsx` binary. Every transfer is
//! verified by hash. Needs root; run with `cargo xtask test`.

// Test code: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use wsx_e2e::{
    Configs, Daemon, assert_no_rules, configs_with, digest, listen, pseudo_random, transfer,
    transfer_payload, wait_for_tunnel,
};
use wsx_lab::traffic::PayloadKind;
use wsx_lab::{Lab, Node, addr};
use wsx_tunnel::SecretKey;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A lab with a 40 ms, 0.5 % loss, 100 Mbit/s WAN, and a directory for configurations.
fn lab() -> (Lab, PathBuf) {
    let lab = wsx_e2e::gateway_lab();
    let dir = wsx_e2e::config_dir(&lab);
    (lab, dir)
}

fn configs() -> Configs {
    let (a, b) = (SecretKey::generate(), SecretKey::generate());
    configs_with(&a, &b)
}

/// Both gateways running with a tunnel between them.
fn gateways(lab: &Lab, dir: &std::path::Path) -> (Daemon, Daemon) {
    let c = configs();
    let gw_a = Daemon::start(lab, Node::GwA, dir, &c.gw_a);
    let gw_b = Daemon::start(lab, Node::GwB, dir, &c.gw_b);
    wait_for_tunnel(&gw_a, &gw_b, 1);
    (gw_a, gw_b)
}

/// The client sends a request and half-closes; the server reads to the end (so the FIN
/// crossed), answers with the request's hash and a body, and closes; the client reads to
/// the end. Returns the client's own address and the client address the server saw.
fn half_close_exchange(lab: &Lab, ipv6: bool) -> (SocketAddr, SocketAddr) {
    let (listener, target) = listen(lab, Node::Server, addr::server(ipv6));
    let request = pseudo_random(3_000_000, 11);
    let body = pseudo_random(2_000_000, 12);
    let expected_body = body.clone();
    let server = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        s.write_all(&digest(&got).to_be_bytes()).unwrap();
        s.write_all(&body).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        peer
    });
    let sent_digest = digest(&request);
    let (client, reply) = lab
        .run_in(Node::Client, move || {
            let mut c = TcpStream::connect(target).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            c.write_all(&request).unwrap();
            c.shutdown(Shutdown::Write).unwrap();
            let mut reply = Vec::new();
            c.read_to_end(&mut reply).unwrap();
            (c.local_addr().unwrap(), reply)
        })
        .unwrap();
    let peer = server.join().unwrap();
    assert_eq!(reply.len(), 8 + expected_body.len());
    assert_eq!(
        reply[..8],
        sent_digest.to_be_bytes(),
        "the server got the request intact"
    );
    assert!(
        reply[8..] == expected_body[..],
        "the client got the body intact"
    );
    (client, peer)
}

#[test]
fn sessions_cross_the_tunnel_both_ways_over_ipv4_and_ipv6() {
    let _serial = serial();
    let (lab, dir) = lab();
    let (gw_a, gw_b) = gateways(&lab, &dir);
    for ipv6 in [false, true] {
        assert_eq!(
            transfer(&lab, Node::Client, Node::Server, ipv6, 3, 2_000_000),
            6_000_000
        );
        // Connections the other way are intercepted by gw-b.
        assert_eq!(
            transfer(&lab, Node::Server, Node::Client, ipv6, 2, 2_000_000),
            4_000_000
        );
        // Transparent re-origination: the server sees the client's own address and port.
        let (client, seen) = half_close_exchange(&lab, ipv6);
        assert_eq!(client.ip(), addr::client(ipv6));
        assert_eq!(seen, client, "the server saw the client's address and port");
    }
    assert_eq!(gw_a.sessions("bypass"), 0);
    assert!(
        gw_a.sessions("tunnel") == 2 * (3 + 1),
        "gw-a carried the client's sessions"
    );
    assert!(
        gw_b.sessions("tunnel") == 2 * 2,
        "gw-b carried the server's sessions"
    );
    let stats = lab.emulator().stats().unwrap();
    assert!(
        stats.a_to_b.drop_random > 0,
        "the WAN lost packets: {stats:?}"
    );
}

/// Compression across real gateways: text goes deflated, random data as it is, and each
/// side decodes exactly what the other sent.
#[test]
fn text_crosses_compressed_and_random_data_as_it_is() {
    let _serial = serial();
    let (lab, dir) = lab();
    let (mut gw_a, mut gw_b) = gateways(&lab, &dir);
    let text = PayloadKind::Text;
    assert_eq!(
        transfer_payload(&lab, Node::Client, Node::Server, false, 2, 4_000_000, text),
        8_000_000
    );
    assert_eq!(
        transfer_payload(
            &lab,
            Node::Server,
            Node::Client,
            true,
            1,
            4_000_000,
            PayloadKind::Random
        ),
        4_000_000
    );
    assert!(gw_a.stop() && gw_b.stop());
    for gw in [&gw_a, &gw_b] {
        gw.wait_for("compression totals", Duration::from_secs(5));
    }
    let (a, b) = (
        gw_a.fields("compression totals"),
        gw_b.fields("compression totals"),
    );
    // gw-a sent the text (and the sink's receipts came back the other way).
    assert!(a["plain_sent"] >= 8_000_000, "{a:?}");
    assert!(
        a["wire_sent"] * 2 < a["plain_sent"],
        "text did not shrink: {a:?}"
    );
    // gw-b sent the random data at under 1 % overhead.
    assert!(b["plain_sent"] >= 4_000_000, "{b:?}");
    assert!(b["wire_sent"] * 100 < b["plain_sent"] * 101, "{b:?}");
    // Each decoded exactly what the other encoded.
    assert_eq!(
        (b["wire_received"], b["plain_received"]),
        (a["wire_sent"], a["plain_sent"])
    );
    assert_eq!(
        (a["wire_received"], a["plain_received"]),
        (b["wire_sent"], b["plain_sent"])
    );
}

#[test]
fn a_refused_connection_reaches_the_client_as_a_reset() {
    let _serial = serial();
    let (lab, dir) = lab();
    let (_gw_a, gw_b) = gateways(&lab, &dir);
    let server = addr::server(false);
    let (error, elapsed) = lab
        .run_in(Node::Client, move || {
            let start = Instant::now();
            // gw-a accepts at once (TPROXY); the refusal comes back through the tunnel.
            let mut c = TcpStream::connect(SocketAddr::new(server, 9)).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut buf = [0u8; 16];
            (c.read(&mut buf), start.elapsed())
        })
        .unwrap();
    let kind = error
        .map(|n| format!("read {n} bytes"))
        .map_err(|e| e.kind());
    assert_eq!(kind, Err(ErrorKind::ConnectionReset));
    assert!(elapsed < Duration::from_secs(2), "took {elapsed:?}");
    gw_b.wait_for("connect failed; stream reset", Duration::from_secs(5));
}

#[test]
fn new_sessions_bypass_a_dead_peer_and_return_to_the_tunnel() {
    let _serial = serial();
    let (lab, dir) = lab();
    let (gw_a, mut gw_b) = gateways(&lab, &dir);
    assert_eq!(
        transfer(&lab, Node::Client, Node::Server, false, 1, 1_000_000),
        1_000_000
    );
    assert_eq!(gw_a.sessions("tunnel"), 1);
    // A crash: nothing is cleaned up on gw-b.
    gw_b.crash();
    // New sessions go direct once gw-a has found the peer silent (not after a fixed
    // wait, which a loaded machine can outlast).
    gw_a.wait_for("peer not heard from", Duration::from_secs(10));
    assert_eq!(
        transfer(&lab, Node::Client, Node::Server, false, 2, 1_000_000),
        2_000_000
    );
    assert_eq!(gw_a.sessions("bypass"), 2, "new sessions went direct");
    // gw-b comes back (removing its leftovers); new sessions use the tunnel again.
    let seen = gw_a.count("tunnel in service");
    let gw_b = Daemon::start_with(&lab, Node::GwB, gw_b.config.clone());
    gw_a.wait_for_count("tunnel in service", seen + 1, Duration::from_secs(20));
    wait_for_tunnel(&gw_a, &gw_b, 1);
    assert_eq!(
        transfer(&lab, Node::Client, Node::Server, false, 1, 1_000_000),
        1_000_000
    );
    assert_eq!(gw_a.sessions("tunnel"), 2, "accelerated again");
}

/// Sessions gw-a relays directly while gw-b is down keep working when gw-b is back and
/// re-originates new sessions of the same client to the same server. Both gateways' port
/// ranges are cut to the same eight ports: had gw-b connected from a port of its own
/// choosing, it would have taken the 4-tuple of a direct session, reset the server's end of
/// it and swallowed its replies. It connects from the client's own port instead. Both
/// gateways drop what conntrack finds INVALID, as a site's stateful firewall does: gw-a's
/// direct leg must not share the intercepted connection's 4-tuple (and so its conntrack
/// entry).
#[test]
fn direct_sessions_survive_the_peers_return() {
    let _serial = serial();
    let (lab, dir) = lab();
    for node in [Node::GwA, Node::GwB] {
        let netns = lab.netns(node);
        let range = "40000 40007";
        wsx_lab::netns::sysctl(&netns, "net.ipv4.ip_local_port_range", range).unwrap();
        let mut firewall = String::from("add table inet site-fw");
        for hook in ["input", "forward", "output"] {
            firewall.push_str(&format!(
                "; add chain inet site-fw {hook} {{ type filter hook {hook} priority filter; }}\
                 ; add rule inet site-fw {hook} ct state invalid counter drop"
            ));
        }
        wsx_lab::netns::exec(&netns, "nft", &[&firewall]).unwrap();
    }
    let (gw_a, mut gw_b) = gateways(&lab, &dir);
    let server = wsx_e2e::echo_server(&lab);
    let open = |n: usize| -> Vec<TcpStream> {
        (0..n)
            .map(|_| {
                let s = lab
                    .run_in(Node::Client, move || TcpStream::connect(server))
                    .unwrap()
                    .unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                s
            })
            .collect()
    };
    let echo = |s: &mut TcpStream, seed: u64| {
        let data = pseudo_random(10_000, seed);
        s.write_all(&data).unwrap();
        let mut got = vec![0u8; data.len()];
        s.read_exact(&mut got)
            .unwrap_or_else(|e| panic!("echo {seed}: {e}"));
        assert_eq!(digest(&got), digest(&data));
    };

    gw_b.crash();
    gw_a.wait_for("peer not heard from", Duration::from_secs(10));
    let mut direct = open(4);
    for (i, s) in (0..).zip(direct.iter_mut()) {
        echo(s, i);
    }
    assert_eq!(gw_a.sessions("bypass"), 4);

    let seen = gw_a.count("tunnel in service");
    let gw_b = Daemon::start_with(&lab, Node::GwB, gw_b.config.clone());
    gw_a.wait_for_count("tunnel in service", seen + 1, Duration::from_secs(20));
    wait_for_tunnel(&gw_a, &gw_b, 1);
    let mut tunnelled = open(4);
    for (i, s) in (10..).zip(tunnelled.iter_mut()) {
        echo(s, i);
    }
    assert_eq!(gw_a.sessions("tunnel"), 4);
    for (i, s) in (20..).zip(direct.iter_mut().chain(tunnelled.iter_mut())) {
        echo(s, i);
    }
}

/// The link goes dark for five seconds: the peer is down for new sessions meanwhile, but the
/// session already in the tunnel waits for it and carries on, every byte echoed, once the
/// link is back; no new handshake replaced the tunnel.
#[test]
fn a_short_outage_costs_the_open_sessions_nothing() {
    let _serial = serial();
    let (lab, dir) = lab();
    let (gw_a, gw_b) = gateways(&lab, &dir);
    let server = wsx_e2e::echo_server(&lab);
    let mut session = lab
        .run_in(Node::Client, move || TcpStream::connect(server))
        .unwrap()
        .unwrap();
    session
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let echo = |s: &mut TcpStream, seed: u64| {
        let data = pseudo_random(100_000, seed);
        let mut writer = s.try_clone().unwrap();
        let sent = data.clone();
        let write = std::thread::spawn(move || writer.write_all(&sent).unwrap());
        let mut got = vec![0u8; data.len()];
        s.read_exact(&mut got).unwrap();
        write.join().unwrap();
        assert_eq!(digest(&got), digest(&data));
    };
    echo(&mut session, 1);
    assert_eq!(gw_a.sessions("tunnel"), 1);

    let normal = wsx_lab::WanSpec {
        rtt_ms: 40.0,
        loss_pct: 0.5,
        rate_mbit: 100.0,
        ..wsx_lab::WanSpec::default()
    }
    .emulator_config();
    let dark = wsx_lab::emulator::LinkParams {
        loss_pct: 100.0,
        ..normal.a_to_b.clone()
    };
    let darkened = Instant::now();
    for direction in [
        wsx_lab::emulator::Direction::AToB,
        wsx_lab::emulator::Direction::BToA,
    ] {
        lab.emulator().set(direction, dark.clone()).unwrap();
    }
    // Data written into the dark waits in the gateways.
    let data = pseudo_random(100_000, 2);
    let mut writer = session.try_clone().unwrap();
    let sent = data.clone();
    let write = std::thread::spawn(move || writer.write_all(&sent).unwrap());
    gw_a.wait_for("peer not heard from", Duration::from_secs(5));
    std::thread::sleep(Duration::from_secs(5).saturating_sub(darkened.elapsed()));
    lab.emulator()
        .set(wsx_lab::emulator::Direction::AToB, normal.a_to_b.clone())
        .unwrap();
    lab.emulator()
        .set(wsx_lab::emulator::Direction::BToA, normal.b_to_a.clone())
        .unwrap();
    let mut got = vec![0u8; data.len()];
    session.read_exact(&mut got).unwrap();
    write.join().unwrap();
    assert_eq!(digest(&got), digest(&data));
    gw_a.wait_for("peer heard from again", Duration::from_secs(10));
    echo(&mut session, 3);
    // The same tunnel throughout: neither side replaced it, no session failed.
    for gw in [&gw_a, &gw_b] {
        assert_eq!(gw.count("tunnel in service"), 1);
        assert_eq!(gw.count("session failed"), 0);
    }
    assert_eq!(
        transfer(&lab, Node::Client, Node::Server, false, 1, 1_000_000),
        1_000_000
    );
    assert_eq!(
        gw_a.sessions("tunnel"),
        2,
        "new sessions use the tunnel again"
    );
}

/// The datagram size a gateway's tunnel uses now, from its last `path MTU` log line.
fn datagram_size(gw: &Daemon) -> u64 {
    gw.fields("path MTU: datagram size")["size"]
}

/// Path MTU discovery on real sockets: over the lab's 1500-byte Ethernet each gateway's
/// tunnel (IPv4) finds 1,472 bytes of UDP payload. Then the path's MTU shrinks to 1,350
/// bytes under two running transfers, and a router on the way drops what does not fit
/// without an ICMP error: the tunnel follows it down (1,322 bytes at most) instead of
/// stalling or failing, and every byte arrives intact.
#[test]
fn a_path_mtu_that_shrinks_under_a_transfer_is_followed() {
    let _serial = serial();
    let (lab, dir) = lab();
    let (gw_a, gw_b) = gateways(&lab, &dir);
    for (name, gw) in [("gw-a", &gw_a), ("gw-b", &gw_b)] {
        gw.wait_for("path MTU: datagram size", Duration::from_secs(10));
        wsx_e2e::wait_until(Duration::from_secs(10), Duration::from_millis(100), || {
            match datagram_size(gw) {
                1472 => Ok(()),
                size => Err(format!("{name} at {size}")),
            }
        });
    }
    let config = lab.emulator().config().unwrap();
    let emulator = lab.emulator().clone();
    let shrink = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        for (direction, params) in [
            (wsx_lab::emulator::Direction::AToB, config.a_to_b),
            (wsx_lab::emulator::Direction::BToA, config.b_to_a),
        ] {
            let params = wsx_lab::emulator::LinkParams {
                mtu: 1350,
                ..params
            };
            emulator.set(direction, params).unwrap();
        }
    });
    assert_eq!(
        transfer(&lab, Node::Client, Node::Server, false, 2, 30_000_000),
        60_000_000
    );
    shrink.join().unwrap();
    let stats = lab.emulator().stats().unwrap();
    assert!(
        stats.a_to_b.drop_too_big > 0,
        "the path dropped nothing: {stats:?}"
    );
    let size = datagram_size(&gw_a);
    assert!(
        (1322 - 16..=1322).contains(&size),
        "gw-a sends {size}-byte datagrams"
    );
    assert!(gw_a.count("full-size packets stopped getting through") >= 1);
    assert_eq!(gw_a.count("session failed"), 0);
    // The same tunnel throughout.
    assert_eq!(gw_a.count("tunnel in service"), 1);
}

#[test]
fn stopping_removes_the_rules_and_traffic_still_flows() {
    let _serial = serial();
    let (lab, dir) = lab();
    let (mut gw_a, mut gw_b) = gateways(&lab, &dir);
    assert!(gw_a.stop(), "gw-a stopped cleanly");
    assert!(gw_b.stop(), "gw-b stopped cleanly");
    for node in [Node::GwA, Node::GwB] {
        assert_no_rules(&lab, node);
    }
    for ipv6 in [false, true] {
        assert_eq!(
            transfer(&lab, Node::Client, Node::Server, ipv6, 1, 1_000_000),
            1_000_000
        );
    }
}

#[test]
fn cleanup_after_a_crash_removes_the_rules() {
    let _serial = serial();
    let (lab, dir) = lab();
    let (mut gw_a, _gw_b) = gateways(&lab, &dir);
    gw_a.crash();
    let netns = lab.netns(Node::GwA);
    let tables = wsx_lab::netns::exec(&netns, "nft", &["list", "tables"]).unwrap();
    assert!(tables.contains("wsx"), "a crash leaves the rules: {tables}");
    // What the systemd unit's ExecStopPost runs.
    let status = lab
        .command(Node::GwA, wsx_e2e::wsx_binary())
        .arg("cleanup")
        .arg("--config")
        .arg(&gw_a.config)
        .status()
        .unwrap();
    assert!(status.success());
    assert_no_rules(&lab, Node::GwA);
    // Plain forwarding again.
    assert_eq!(
        transfer(&lab, Node::Client, Node::Server, false, 1, 1_000_000),
        1_000_000
    );
}

#[test]
fn a_thousand_concurrent_sessions_complete() {
    let _serial = serial();
    let (lab, dir) = lab();
    let (gw_a, _gw_b) = gateways(&lab, &dir);
    assert_eq!(
        transfer(&lab, Node::Client, Node::Server, false, 1000, 20_000),
        20_000_000
    );
    assert_eq!(gw_a.sessions("bypass"), 0);
    gw_a.wait_for_count("session closed", 1000, Duration::from_secs(30));
}

#[test]
fn a_reload_changes_prefixes_and_keeps_live_sessions() {
    let _serial = serial();
    let (lab, dir) = lab();
    let (a, b) = (SecretKey::generate(), SecretKey::generate());
    let full = configs_with(&a, &b);
    // First gw-a accelerates only the IPv4 prefix.
    let ipv4_only = full
        .gw_a
        .replace(&format!(", \"{}\"", addr::server_lan()[1]), "");
    assert_ne!(ipv4_only, full.gw_a);
    let gw_a = Daemon::start(&lab, Node::GwA, &dir, &ipv4_only);
    let gw_b = Daemon::start(&lab, Node::GwB, &dir, &full.gw_b);
    wait_for_tunnel(&gw_a, &gw_b, 1);
    assert_eq!(
        transfer(&lab, Node::Client, Node::Server, true, 1, 500_000),
        500_000
    );
    assert_eq!(gw_a.sessions("tunnel"), 0, "IPv6 was not intercepted");
    // A session that lives through the reload.
    let live = {
        let (listener, target) = listen(&lab, Node::Server, addr::server(false));
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            s.write_all(&digest(&got).to_be_bytes()).unwrap();
        });
        // On a thread of its own: the reload happens while it runs.
        let netns = lab.netns(Node::Client);
        let client = std::thread::spawn(move || {
            wsx_lab::netns::run_in(&netns, move || {
                let mut c = TcpStream::connect(target).unwrap();
                c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let data = pseudo_random(200_000, 5);
                c.write_all(&data[..100_000]).unwrap();
                std::thread::sleep(Duration::from_secs(2));
                c.write_all(&data[100_000..]).unwrap();
                c.shutdown(Shutdown::Write).unwrap();
                let mut reply = [0u8; 8];
                c.read_exact(&mut reply).unwrap();
                (u64::from_be_bytes(reply), digest(&data))
            })
            .unwrap()
        });
        (server, client)
    };
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(&gw_a.config, &full.gw_a).unwrap();
    gw_a.signal(libc::SIGHUP);
    gw_a.wait_for("configuration reloaded", Duration::from_secs(10));
    let (server, client) = live;
    let (got, sent) = client.join().unwrap();
    server.join().unwrap();
    assert_eq!(got, sent, "the session that spanned the reload is intact");
    assert_eq!(
        transfer(&lab, Node::Client, Node::Server, true, 1, 500_000),
        500_000
    );
    assert_eq!(
        gw_a.sessions("tunnel"),
        2,
        "the long session and the IPv6 one after the reload"
    );
    // A broken file is refused and the running configuration stays.
    std::fs::write(&gw_a.config, "[tunnel]\nlisten = 5\n").unwrap();
    gw_a.signal(libc::SIGHUP);
    gw_a.wait_for("reload failed", Duration::from_secs(10));
    assert_eq!(
        transfer(&lab, Node::Client, Node::Server, false, 1, 500_000),
        500_000
    );
    assert_eq!(gw_a.sessions("tunnel"), 3);
}

#[test]
fn a_secondary_peer_takes_over_from_a_dead_primary() {
    let _serial = serial();
    let (lab, dir) = lab();
    let (a, primary, backup) = (
        SecretKey::generate(),
        SecretKey::generate(),
        SecretKey::generate(),
    );
    let c = configs_with(&a, &primary);
    // gw-a knows two peers on gw-b: the primary, and a backup instance on port 4600 that
    // connects to servers from gw-b's own address (it needs no rules, so two instances can
    // share the namespace).
    let gw_a_config = c.gw_a.replace(
        "name = \"gw-b\"",
        "name = \"primary\"\nsecondary = \"backup\"",
    ) + &format!(
        "\n[[peer]]\nname = \"backup\"\npublic_key = \"{}\"\nendpoint = \"{}\"\n",
        backup.public_key(),
        SocketAddr::new(addr::GWB_WAN_V4.into(), 4600)
    );
    let backup_config = format!(
        "[tunnel]\nlisten = \"[::]:4600\"\nprivate_key = \"{}\"\n\n[sessions]\ntransparent_origin = false\n\n\
         [[peer]]\nname = \"gw-a\"\npublic_key = \"{}\"\n",
        backup.to_base64(),
        a.public_key()
    );
    let gw_a = Daemon::start(&lab, Node::GwA, &dir, &gw_a_config);
    let mut gw_b = Daemon::start(&lab, Node::GwB, &dir, &c.gw_b);
    let backup_dir = dir.join("backup");
    std::fs::create_dir_all(&backup_dir).unwrap();
    let gw_b_backup = Daemon::start(&lab, Node::GwB, &backup_dir, &backup_config);
    gw_a.wait_for_count("tunnel in service", 2, Duration::from_secs(20));
    gw_b_backup.wait_for("tunnel in service", Duration::from_secs(20));
    assert_eq!(
        transfer(&lab, Node::Client, Node::Server, false, 1, 1_000_000),
        1_000_000
    );
    assert_eq!(gw_a.count_all(&["peer=\"primary\"", "session opened"]), 1);
    gw_b.crash();
    gw_a.wait_for("peer not heard from", Duration::from_secs(10));
    assert_eq!(
        transfer(&lab, Node::Client, Node::Server, false, 2, 1_000_000),
        2_000_000
    );
    assert_eq!(
        gw_a.count_all(&["peer=\"backup\"", "route=\"tunnel\"", "session opened"]),
        2
    );
    assert_eq!(gw_a.sessions("bypass"), 0);
    assert_eq!(gw_b_backup.sessions("inbound"), 2);
}

#[test]
fn a_slow_server_does_not_grow_the_gateways_memory() {
    let _serial = serial();
    let (lab, dir) = lab();
    let (gw_a, gw_b) = gateways(&lab, &dir);
    let baseline = (gw_a.max_rss_kb(), gw_b.max_rss_kb());
    let (listener, target) = listen(&lab, Node::Server, addr::server(false));
    // The server reads 64 KiB every 50 ms (~10 Mbit/s) for 8 s while the client offers
    // 200 MB as fast as it can.
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0u64;
        let end = Instant::now() + Duration::from_secs(8);
        while Instant::now() < end {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => total += n as u64,
                Err(e) => panic!("{e}"),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        total
    });
    let client = lab.run_in(Node::Client, move || {
        let mut c = TcpStream::connect(target).unwrap();
        c.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        let chunk = pseudo_random(1 << 20, 3);
        let mut sent = 0u64;
        while sent < 200_000_000 {
            match c.write(&chunk) {
                Ok(n) => sent += n as u64,
                Err(_) => break,
            }
        }
        sent
    });
    let read = server.join().unwrap();
    let sent = client.unwrap();
    let (a, b) = (gw_a.max_rss_kb(), gw_b.max_rss_kb());
    eprintln!(
        "server read {read} B, client wrote {sent} B; peak RSS gw-a {a} KiB, gw-b {b} KiB (at start {baseline:?})"
    );
    assert!(
        sent < 100_000_000,
        "the client was held back: it wrote {sent} B"
    );
    // The bound: the tunnel's stream buffers (8 MiB at each end by default), the relay
    // buffers and the socket buffers, over what each gateway used at the start.
    assert!(
        a < baseline.0 + 32 * 1024,
        "gw-a grew from {} to {a} KiB",
        baseline.0
    );
    assert!(
        b < baseline.1 + 32 * 1024,
        "gw-b grew from {} to {b} KiB",
        baseline.1
    );
}
