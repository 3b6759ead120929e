//! The lab end to end: plain kernel TCP from client to server through gw-a, the emulated WAN
//! and gw-b, over IPv4 and IPv6, every byte verified; the same over a clean, jumbo-frame WAN
//! (a kernel bridge instead of the emulator); and no namespace outlives its lab.
//! Needs root; run with `cargo xtask test`.

// Test code: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use wsx_lab::emulator::LinkParams;
use wsx_lab::traffic::{self, PayloadKind, SendOptions, SinkOptions};
use wsx_lab::{Lab, Node, WanSpec, addr};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts a verifying sink for `flows` connections on the server; returns its address and the
/// thread that will return its report.
fn start_sink(lab: &Lab, ipv6: bool, flows: u16) -> (SocketAddr, JoinHandle<traffic::SinkReport>) {
    let (listener, target) = wsx_e2e::listen(lab, Node::Server, addr::server(ipv6));
    let options = SinkOptions {
        flows,
        idle_timeout: Duration::from_secs(30),
    };
    (
        target,
        std::thread::spawn(move || traffic::sink(&listener, options).unwrap()),
    )
}

/// Transfers `bytes` on each of `flows` connections from client to server and returns the
/// verified byte count the sink saw.
fn transfer(lab: &Lab, ipv6: bool, flows: u16, bytes: u64, payload: PayloadKind, cc: &str) -> u64 {
    let (target, sink) = start_sink(lab, ipv6, flows);
    let options = SendOptions {
        to: target,
        flows,
        bytes: Some(bytes),
        seconds: 0.0,
        congestion: Some(cc.into()),
        payload,
        seed: 99,
        receipt_timeout: Duration::from_secs(60),
        rate_bps: None,
    };
    let sent = lab
        .run_in(Node::Client, move || traffic::send(&options))
        .unwrap()
        .unwrap();
    let received = sink.join().unwrap();
    assert!(sent.verified(), "sender: {:?}", sent.flows);
    assert!(received.verified(), "sink: {:?}", received.flows);
    assert!(
        sent.flows.iter().all(|f| f.congestion == cc),
        "congestion control {:?}",
        sent.flows
    );
    received.flows.iter().map(|f| f.bytes).sum()
}

#[test]
fn tcp_crosses_the_lab_verified_over_ipv4_and_ipv6() {
    let _serial = serial();
    let wan = WanSpec {
        rtt_ms: 20.0,
        loss_pct: 0.5,
        rate_mbit: 100.0,
        ..WanSpec::default()
    };
    let lab = Lab::start(&wan.emulator_config()).unwrap();
    for ipv6 in [false, true] {
        for (payload, cc) in [(PayloadKind::Random, "cubic"), (PayloadKind::Text, "bbr")] {
            assert_eq!(transfer(&lab, ipv6, 3, 2_000_000, payload, cc), 6_000_000);
        }
    }
    let stats = lab.emulator().stats().unwrap();
    assert!(
        stats.a_to_b.fwd_bytes > 4 * 6_000_000,
        "the data crossed the emulator: {stats:?}"
    );
    assert!(
        stats.a_to_b.drop_random > 0 && stats.b_to_a.drop_random > 0,
        "loss in both directions"
    );
    assert_eq!(
        stats.a_to_b.emulator_faults + stats.b_to_a.emulator_faults,
        0,
        "{stats:?}"
    );
}

#[test]
fn a_clean_lab_bridges_the_wan_in_the_kernel_with_jumbo_frames() {
    let _serial = serial();
    let lab = Lab::start_clean(9000).unwrap();
    assert_eq!(lab.emulator_pid(), None);
    let error = lab.emulator().stats().unwrap_err().to_string();
    assert!(error.contains("kernel bridge"), "{error}");
    for ipv6 in [false, true] {
        assert_eq!(
            transfer(&lab, ipv6, 2, 5_000_000, PayloadKind::Random, "cubic"),
            10_000_000
        );
    }
    // The WAN carries 9,000-byte frames end to end: a datagram that fills one, sent with
    // "don't fragment", arrives whole (a veth drops a frame larger than its peer's MTU, and
    // the sender refuses one larger than its own).
    let receiver = lab
        .run_in(Node::GwB, || {
            std::net::UdpSocket::bind((addr::GWB_WAN_V4, 0)).unwrap()
        })
        .unwrap();
    receiver
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let to = receiver.local_addr().unwrap();
    lab.run_in(Node::GwA, move || {
        let sender = std::net::UdpSocket::bind((addr::GWA_WAN_V4, 0)).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&sender);
        let on = libc::IP_PMTUDISC_DO;
        // SAFETY: a valid socket, and an int option of the size given.
        let set = unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                std::ptr::from_ref(&on).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0);
        sender.send_to(&[0x5a; 8972], to).unwrap();
    })
    .unwrap();
    let mut buf = [0u8; 9216];
    assert_eq!(receiver.recv(&mut buf).unwrap(), 8972);
    assert!(Lab::start_clean(576).is_err(), "below IPv6's minimum MTU");
}

#[test]
fn corruption_is_detected() {
    // The sink compares against the expected stream: a sender with another seed fails.
    let _serial = serial();
    let lab = Lab::start(
        &WanSpec {
            rtt_ms: 2.0,
            ..WanSpec::default()
        }
        .emulator_config(),
    )
    .unwrap();
    let (target, sink) = start_sink(&lab, false, 1);
    let client = lab
        .run_in(Node::Client, move || std::net::TcpStream::connect(target))
        .unwrap()
        .unwrap();
    // A valid header for seed 1, then bytes of another stream.
    let mut header_source = traffic::Payload::new(PayloadKind::Random, 2, 0);
    let mut wrong = vec![0u8; 10_000];
    header_source.fill(&mut wrong);
    let mut header = [0u8; 40];
    header[..4].copy_from_slice(b"WSXT");
    header[4] = 1;
    header[8..16].copy_from_slice(&1u64.to_be_bytes());
    use std::io::Write;
    (&client).write_all(&header).unwrap();
    (&client).write_all(&wrong).unwrap();
    client.shutdown(std::net::Shutdown::Write).unwrap();
    let report = sink.join().unwrap();
    assert!(!report.verified());
    assert!(
        report.flows[0]
            .error
            .as_deref()
            .unwrap_or("")
            .contains("differs"),
        "{:?}",
        report.flows
    );
}

#[test]
fn namespaces_do_not_outlive_their_lab_even_when_a_test_panics() {
    let _serial = serial();
    let mine = |name: &str| -> Vec<String> {
        wsx_lab::netns::list()
            .into_iter()
            .filter(|n| n.starts_with(&format!("{name}-")))
            .collect()
    };
    let lab = Lab::start(&Default::default()).unwrap();
    let name = lab.name().to_string();
    assert_eq!(mine(&name).len(), 5, "client, gw-a, wan, gw-b, server");
    let emulator = lab.emulator_pid().expect("an emulated lab");
    drop(lab);
    assert!(mine(&name).is_empty());
    assert!(
        !std::path::Path::new(&format!("/proc/{emulator}")).exists(),
        "emulator killed"
    );

    let panicked = std::thread::spawn(|| {
        let lab = Lab::start(&Default::default()).unwrap();
        let name = lab.name().to_string();
        std::fs::write(std::env::temp_dir().join("wsx-lab-panic-test"), &name).unwrap();
        panic!("a failing test");
    })
    .join();
    assert!(panicked.is_err());
    let name = std::fs::read_to_string(std::env::temp_dir().join("wsx-lab-panic-test")).unwrap();
    assert!(
        mine(&name).is_empty(),
        "namespaces of {name} leaked: {:?}",
        mine(&name)
    );
}

#[test]
fn the_lab_refuses_invalid_parameters() {
    let mut config = WanSpec::default().emulator_config();
    config.a_to_b = LinkParams {
        loss_pct: -1.0,
        ..LinkParams::default()
    };
    let err = Lab::start(&config).unwrap_err();
    assert!(format!("{err:#}").contains("loss_pct"), "{err:#}");
}
