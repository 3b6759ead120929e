//! Forwarding listeners end to end: an application on site A connects to a port on gw-a
//! (no interception, no rules, no privileges), and gw-b connects to the configured
//! destination: an address on site B, or a name that gw-b resolves. Every transfer is
//! verified by hash. Needs root (for the lab); run with `cargo xtask test`.

// Test code: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;
use wsx_e2e::{Daemon, configs_with, listen, transfer_through, wait_for_tunnel};
use wsx_lab::traffic::PayloadKind;
use wsx_lab::{Node, addr};
use wsx_tunnel::SecretKey;

#[test]
fn forwarding_listeners_carry_sessions_to_addresses_and_names_without_privileges() {
    let lab = wsx_e2e::gateway_lab();
    let dir = wsx_e2e::config_dir(&lab);
    // The destinations: a server on site B (by address, IPv4 and IPv6), and one on gw-b's
    // own loopback that only the name "localhost", resolved at gw-b, reaches.
    let (server_v4, server_v4_addr) = listen(&lab, Node::Server, addr::server(false));
    let (server_v6, server_v6_addr) = listen(&lab, Node::Server, addr::server(true));
    let (local, local_addr) = listen(&lab, Node::GwB, IpAddr::V4(Ipv4Addr::LOCALHOST));
    // And one that tells who connected.
    let (probe, probe_addr) = listen(&lab, Node::Server, addr::server(false));

    let entry = |ip: IpAddr, port: u16| SocketAddr::new(ip, port);
    let entries = [
        (
            "by-v4",
            entry(addr::GWA_LAN_V4.into(), 7001),
            server_v4_addr.to_string(),
        ),
        (
            "by-v6",
            entry(addr::GWA_LAN_V6.into(), 7002),
            server_v6_addr.to_string(),
        ),
        (
            "by-name",
            entry(addr::GWA_LAN_V4.into(), 7003),
            format!("localhost:{}", local_addr.port()),
        ),
    ];
    let probe_entry = entry(addr::GWA_LAN_V4.into(), 7004);
    let c = configs_with(&SecretKey::generate(), &SecretKey::generate());
    // gw-a: no [intercept], no transparent origin: nothing that needs a capability.
    let mut gw_a = c
        .gw_a
        .replace("[intercept]\ninterfaces = [\"lan0\"]\n", "")
        .replace("[sessions]\n", "[sessions]\ntransparent_origin = false\n");
    for (name, listen, to) in &entries {
        gw_a.push_str(&format!(
            "\n[[forward]]\nname = \"{name}\"\nlisten = \"{listen}\"\nto = \"{to}\"\npeer = \"gw-b\"\n"
        ));
    }
    gw_a.push_str(&format!(
        "\n[[forward]]\nname = \"probe\"\nlisten = \"{probe_entry}\"\nto = \"{probe_addr}\"\npeer = \"gw-b\"\n"
    ));
    let gw_a = Daemon::start_unprivileged(&lab, Node::GwA, &dir, &gw_a);
    assert_eq!(
        gw_a.effective_capabilities(),
        0,
        "gw-a runs without capabilities"
    );
    let gw_b = Daemon::start(&lab, Node::GwB, &dir, &c.gw_b);
    wait_for_tunnel(&gw_a, &gw_b, 1);

    let sinks = [server_v4, server_v6, local];
    for ((name, listen, _), sink) in entries.iter().zip(sinks) {
        assert_eq!(
            transfer_through(
                &lab,
                Node::Client,
                sink,
                *listen,
                2,
                1_000_000,
                PayloadKind::Random
            ),
            2_000_000,
            "{name}"
        );
    }
    // Each session says which listener it came in by, and went through the tunnel.
    for (name, _, _) in &entries {
        let entry = format!("entry=forward:{name}");
        gw_a.wait_for_count(&entry, 2, Duration::from_secs(5));
        assert_eq!(
            gw_a.count_all(&[&entry, "route=\"tunnel\"", "session opened"]),
            2,
            "{name}"
        );
    }
    assert_eq!(gw_b.count_all(&["entry=tunnel", "session opened"]), 6);
    // gw-b connects from its own address, not the client's: the client is not on site B's
    // LAN, and gw-b has transparent origin on (the default) for intercepted sessions.
    let accepted = std::thread::spawn(move || {
        let (mut s, from) = probe.accept().unwrap();
        let mut byte = [0u8; 1];
        s.read_exact(&mut byte).unwrap();
        from.ip()
    });
    let mut client = lab
        .run_in(Node::Client, move || TcpStream::connect(probe_entry))
        .unwrap()
        .unwrap();
    client.write_all(b"x").unwrap();
    assert_eq!(accepted.join().unwrap(), IpAddr::from(addr::GWB_LAN_V4));
}
