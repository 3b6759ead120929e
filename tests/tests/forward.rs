//! Explicit entry points end to end: an application on site A connects to a forwarding
//! listener or a SOCKS5 listener on gw-a (no interception, no rules, no privileges), and
//! gw-b connects to the destination: an address on site B, or a name that gw-b resolves.
//! Every transfer is verified by hash. Needs root (for the lab); run with `cargo xtask test`.

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
    let opened = ["entry=tunnel", "session opened"];
    gw_b.wait_for_count_all(&opened, 6, Duration::from_secs(10));
    assert_eq!(gw_b.count_all(&opened), 6);
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

    // The peer bypassed (forced, by a reload): "localhost" means gw-b's own loopback, which
    // gw-a cannot reach; the session is refused rather than sent to gw-a's own loopback,
    // where a service on the same port waits in vain.
    let port = local_addr.port();
    let decoy = lab
        .run_in(Node::GwA, move || {
            std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port))
        })
        .unwrap()
        .unwrap();
    decoy.set_nonblocking(true).unwrap();
    let reloads = gw_a.count("configuration reloaded");
    let text = std::fs::read_to_string(&gw_a.config).unwrap();
    let forced = text.replace(
        "name = \"gw-b\"\n",
        "name = \"gw-b\"\nforce_bypass = true\n",
    );
    assert_ne!(forced, text);
    std::fs::write(&gw_a.config, forced).unwrap();
    gw_a.signal(libc::SIGHUP);
    gw_a.wait_for_count(
        "configuration reloaded",
        reloads + 1,
        Duration::from_secs(10),
    );
    let by_name = entries[2].1;
    let refused = lab
        .run_in(Node::Client, move || {
            let mut c = TcpStream::connect(by_name)?;
            c.set_read_timeout(Some(Duration::from_secs(10)))?;
            c.read(&mut [0u8; 1])
        })
        .unwrap();
    assert!(
        matches!(&refused, Ok(0))
            || refused
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "{refused:?}"
    );
    gw_a.wait_for("cannot be reached from here", Duration::from_secs(5));
    assert!(decoy.accept().is_err(), "gw-a's own loopback was reached");
}

/// Serves `body` over HTTP/1.1 to `count` requests on `listener` (one per connection).
fn serve(
    listener: std::net::TcpListener,
    body: Vec<u8>,
    count: usize,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for _ in 0..count {
            let (mut s, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut byte = [0u8; 1];
            while !request.ends_with(b"\r\n\r\n") {
                s.read_exact(&mut byte).unwrap();
                request.push(byte[0]);
            }
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).unwrap();
            s.write_all(&body).unwrap();
        }
    })
}

#[test]
fn socks5_clients_reach_addresses_and_names_through_the_tunnel_and_bad_requests_get_codes() {
    let lab = wsx_e2e::gateway_lab();
    let dir = wsx_e2e::config_dir(&lab);
    let body = wsx_e2e::pseudo_random(3_000_000, 21);
    let (v4, v4_addr) = listen(&lab, Node::Server, addr::server(false));
    let (v6, v6_addr) = listen(&lab, Node::Server, addr::server(true));
    let (local, local_addr) = listen(&lab, Node::GwB, IpAddr::V4(Ipv4Addr::LOCALHOST));
    let servers = [
        serve(v4, body.clone(), 1),
        serve(v6, body.clone(), 1),
        serve(local, body.clone(), 2),
    ];

    let proxy = SocketAddr::new(addr::GWA_LAN_V4.into(), 1080);
    let c = configs_with(&SecretKey::generate(), &SecretKey::generate());
    let gw_a = c
        .gw_a
        .replace("[intercept]\ninterfaces = [\"lan0\"]\n", "")
        .replace("[sessions]\n", "[sessions]\ntransparent_origin = false\n")
        + &format!(
            "\n[[socks]]\nname = \"apps\"\nlisten = \"{proxy}\"\npeer = \"gw-b\"\nusers = [{{ name = \"alice\", password = \"pa55word\" }}]\n"
        );
    let gw_a = Daemon::start_unprivileged(&lab, Node::GwA, &dir, &gw_a);
    let gw_b = Daemon::start(&lab, Node::GwB, &dir, &c.gw_b);
    wait_for_tunnel(&gw_a, &gw_b, 1);

    // curl, resolving names at the proxy (at gw-b, in the end).
    let fetch = |url: String| {
        let file = dir.join(format!("fetched-{}", file_name_for(&url)));
        let out = lab
            .command(Node::Client, "curl")
            .args(["--silent", "--show-error", "--fail", "--max-time", "30"])
            .args([
                "--socks5-hostname",
                &proxy.to_string(),
                "--proxy-user",
                "alice:pa55word",
            ])
            .arg("--output")
            .arg(&file)
            .arg(&url)
            .output()
            .unwrap();
        assert!(out.status.success(), "curl {url}: {out:?}");
        let got = std::fs::read(&file).unwrap();
        assert_eq!(wsx_e2e::digest(&got), wsx_e2e::digest(&body), "{url}");
    };
    fetch(format!("http://{v4_addr}/"));
    fetch(format!("http://{v6_addr}/"));
    fetch(format!("http://localhost:{}/", local_addr.port()));

    // Bad requests, by hand, get the RFC's answers; the listener keeps serving.
    let talk = |send: &[u8], expect: usize| -> Vec<u8> {
        let send = send.to_vec();
        lab.run_in(Node::Client, move || {
            let mut s = TcpStream::connect(proxy).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(&send).unwrap();
            let mut got = Vec::new();
            let _ = s.take(expect as u64 + 1).read_to_end(&mut got);
            got
        })
        .unwrap()
    };
    // SOCKS4: closed without an answer.
    assert_eq!(talk(&[4, 1, 0, 80, 10, 71, 3, 2, 0], 8), b"");
    // No username/password offered: no acceptable method.
    assert_eq!(talk(&[5, 1, 0], 2), [5, 0xff]);
    // Wrong password.
    let mut wrong = vec![5, 1, 2, 1, 5];
    wrong.extend_from_slice(b"alice");
    wrong.push(5);
    wrong.extend_from_slice(b"guess");
    assert_eq!(talk(&wrong, 4), [5, 2, 1, 1]);
    // BIND: command not supported (07); address type 9: not supported (08).
    let login = |rest: &[u8]| {
        let mut bytes = vec![5, 1, 2, 1, 5];
        bytes.extend_from_slice(b"alice");
        bytes.push(8);
        bytes.extend_from_slice(b"pa55word");
        bytes.extend_from_slice(rest);
        bytes
    };
    let reply = talk(&login(&[5, 2, 0, 1, 10, 71, 3, 2, 0, 80]), 14);
    assert_eq!(&reply[4..6], [5, 7], "{reply:?}");
    let reply = talk(&login(&[5, 1, 0, 9, 1, 2, 3]), 14);
    assert_eq!(&reply[4..6], [5, 8], "{reply:?}");
    // Still serving.
    fetch(format!("http://localhost:{}/", local_addr.port()));
    for s in servers {
        s.join().unwrap();
    }
    let opened = ["entry=socks:apps", "session opened"];
    gw_a.wait_for_count_all(&opened, 4, Duration::from_secs(10));
    assert_eq!(gw_a.count_all(&opened), 4);
}

/// A file name for a URL.
fn file_name_for(url: &str) -> String {
    format!("{:016x}", wsx_e2e::digest(url.as_bytes()))
}
