//! The bandwidth controller end to end: sessions classified by their destination port into
//! an accelerated scenario held to a maximum, a directly relayed one, a discard one, and the
//! default; by the DSCP and the interface they arrived with; the API's counters for each; a reload that changes a rate under a live session.
//! Real kernel TCP through both gateways and the emulated WAN; every transfer is verified
//! by hash. Needs root; run with `cargo xtask test`.

// Test code: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use serde_json::Value;
use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;
use wsx_e2e::{Daemon, configs_with, listen, transfer_through, wait_for_tunnel};
use wsx_lab::traffic::PayloadKind;
use wsx_lab::{Lab, Node, addr};
use wsx_tunnel::SecretKey;

const TOKEN: &str = "e2e-shaper-token-0123456789";
const API: &str = "127.0.0.1:9181";

/// The shaper's part of a configuration: `bulk` (accelerated, at most `bulk_mbit`),
/// `near` (relayed directly, at most 20 Mbit/s), `blocked` (discarded), by destination
/// port; everything else in the default scenario.
fn shaper_section(ports: &Ports, bulk_mbit: u32) -> String {
    format!(
        r#"
[shaper]
wan_rate = "90 Mbit/s"

[[scenario]]
name = "bulk"
max_rate = "{bulk_mbit} Mbit/s"
priority = 4
dscp = 10

[[scenario]]
name = "near"
mode = "aggregate"
max_rate = "20 Mbit/s"

[[scenario]]
name = "each"
mode = "fixed"
flow_rate = "4 Mbit/s"

[[scenario]]
name = "blocked"
mode = "discard"

[[filter]]
scenario = "bulk"
destination_port = [{bulk}, {bulk_later}]

[[filter]]
scenario = "near"
destination_port = [{near}]

[[filter]]
scenario = "blocked"
destination_port = ["{blocked}-{blocked}"]

[[filter]]
scenario = "each"
destination_port = [{each}]

[[filter]]
scenario = "blocked"
dscp = [46]

[[filter]]
scenario = "blocked"
destination_port = [{arrival}]
interface = ["wan0"]

[[filter]]
scenario = "near"
destination_port = [{arrival}]
interface = ["lan0"]
"#,
        bulk = ports.bulk.port(),
        bulk_later = ports.bulk_later.port(),
        near = ports.near.port(),
        blocked = ports.blocked.port(),
        each = ports.each.port(),
        arrival = ports.arrival.port(),
    )
}

struct Ports {
    bulk: SocketAddr,
    /// For the session that lives through a reload.
    bulk_later: SocketAddr,
    near: SocketAddr,
    blocked: SocketAddr,
    /// Fixed: each flow at 4 Mbit/s.
    each: SocketAddr,
    /// Classified by how the session arrived: DSCP 46 is discarded; otherwise by the
    /// ingress interface, `lan0` (near) and not `wan0` (blocked).
    arrival: SocketAddr,
}

/// A request to gw-a's API with an optional JSON body: the status and the answer (JSON,
/// or the text as a JSON string).
fn send(lab: &Lab, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let body = body.map(|b| ("application/json", b.to_string()));
    let (status, text) = wsx_e2e::api_request(lab, Node::GwA, (API, TOKEN), (method, path), body);
    let answer = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, answer)
}

/// `GET path` on gw-a's API, which must answer 200 with JSON.
fn api(lab: &Lab, path: &str) -> Value {
    let (status, answer) = send(lab, "GET", path, None);
    assert_eq!(status, 200, "{path}: {answer}");
    answer
}

fn scenario<'a>(shaper: &'a Value, name: &str) -> &'a Value {
    shaper["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no scenario {name}: {shaper}"))
}

fn sink(lab: &Lab) -> (TcpListener, SocketAddr) {
    listen(lab, Node::Server, addr::server(false))
}

#[test]
fn scenarios_hold_rates_relay_directly_discard_and_survive_a_reload() {
    let lab = wsx_e2e::gateway_lab();
    let dir = wsx_e2e::config_dir(&lab);
    let (bulk_sink, bulk) = sink(&lab);
    let (later_sink, bulk_later) = sink(&lab);
    let (near_sink, near) = sink(&lab);
    let (blocked_sink, blocked) = sink(&lab);
    let (each_sink, each) = sink(&lab);
    let (arrival_sink, arrival) = sink(&lab);
    let ports = Ports {
        bulk,
        bulk_later,
        near,
        blocked,
        each,
        arrival,
    };
    let c = configs_with(&SecretKey::generate(), &SecretKey::generate());
    let api_section = format!("\n[api]\nlisten = \"{API}\"\ntokens = [\"{TOKEN}\"]\n");
    let gw_a_config =
        |bulk_mbit| c.gw_a.clone() + &api_section + &shaper_section(&ports, bulk_mbit);
    let gw_a = Daemon::start(&lab, Node::GwA, &dir, &gw_a_config(8));
    // gw-b classifies the inbound sessions by its own filters: what it sends back.
    let gw_b = Daemon::start(
        &lab,
        Node::GwB,
        &dir,
        &(c.gw_b.clone() + &shaper_section(&ports, 8)),
    );
    gw_a.wait_for("API listening", Duration::from_secs(10));
    wait_for_tunnel(&gw_a, &gw_b, 1);

    // Accelerated and held to 8 Mbit/s: 3 MB take about 3 s, in tunnel packets marked
    // with the scenario's DSCP (10), counted as they leave gw-a.
    let gw_a_ns = lab.netns(Node::GwA);
    let nft = |args: &[&str]| wsx_lab::netns::exec(&gw_a_ns, "nft", args).unwrap();
    nft(&["add", "table", "inet", "e2e_dscp"]);
    nft(&["add chain inet e2e_dscp out { type filter hook postrouting priority 0 ; }"]);
    nft(&["add rule inet e2e_dscp out oifname wan0 meta l4proto udp ip dscp 10 counter"]);
    let random = PayloadKind::Random;
    assert_eq!(
        transfer_through(&lab, Node::Client, bulk_sink, bulk, 2, 1_500_000, random),
        3_000_000
    );
    let counted = nft(&["-j", "list", "table", "inet", "e2e_dscp"]);
    let counted: Value = serde_json::from_str(&counted).unwrap();
    let marked_bytes = counted["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|item| {
            let expr = item["rule"]["expr"].as_array()?;
            expr.iter().find_map(|e| e["counter"]["bytes"].as_u64())
        })
        .unwrap();
    // The payload, its headers and what loss recovery sent again; nothing else is marked.
    assert!(
        (3_000_000..3_600_000).contains(&marked_bytes),
        "{marked_bytes} bytes marked"
    );
    // Relayed directly by gw-a, shaped there.
    assert_eq!(
        transfer_through(&lab, Node::Client, near_sink, near, 1, 2_000_000, random),
        2_000_000
    );
    // Fixed: two flows, each held to 4 Mbit/s, relayed directly.
    assert_eq!(
        transfer_through(&lab, Node::Client, each_sink, each, 2, 1_000_000, random),
        2_000_000
    );
    // Discarded: the client is reset, the server never sees it.
    let refused = lab
        .run_in(Node::Client, move || {
            let mut c = TcpStream::connect(blocked).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            c.read(&mut [0u8; 16]).map_err(|e| e.kind())
        })
        .unwrap();
    assert!(
        matches!(refused, Ok(0) | Err(ErrorKind::ConnectionReset)),
        "{refused:?}"
    );
    blocked_sink.set_nonblocking(true).unwrap();
    assert!(
        blocked_sink.accept().is_err(),
        "the server saw a discarded session"
    );
    // By how it arrived: marked EF (DSCP 46) it is discarded, whatever its port; unmarked,
    // its ingress interface (lan0) puts it in `near`.
    let marked = lab
        .run_in(Node::Client, move || {
            let socket = socket2::Socket::new(
                socket2::Domain::IPV4,
                socket2::Type::STREAM,
                Some(socket2::Protocol::TCP),
            )
            .unwrap();
            socket.set_tos(46 << 2).unwrap();
            socket.connect(&arrival.into()).unwrap();
            let mut c = TcpStream::from(socket);
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            c.read(&mut [0u8; 16]).map_err(|e| e.kind())
        })
        .unwrap();
    assert!(
        matches!(marked, Ok(0) | Err(ErrorKind::ConnectionReset)),
        "{marked:?}"
    );
    assert_eq!(
        transfer_through(
            &lab,
            Node::Client,
            arrival_sink,
            arrival,
            1,
            1_000_000,
            random
        ),
        1_000_000
    );

    let shaper = api(&lab, "/api/v1/shaper");
    let bulk_state = scenario(&shaper, "bulk");
    // Everything the client sent, and the sink's receipts: at least the payload.
    assert!(
        bulk_state["bytes"].as_u64().unwrap() >= 3_000_000,
        "{bulk_state}"
    );
    assert!(
        bulk_state["held_at_max_seconds"].as_f64().unwrap() > 1.0,
        "{bulk_state}"
    );
    assert_eq!(bulk_state["mode"], "accelerate");
    let near_state = scenario(&shaper, "near");
    assert!(
        near_state["bytes"].as_u64().unwrap() >= 2_000_000,
        "{near_state}"
    );
    assert!(
        near_state["held_at_max_seconds"].as_f64().unwrap() > 0.2,
        "{near_state}"
    );
    assert_eq!(scenario(&shaper, "blocked")["discarded"], 2);
    let filters = shaper["filters"].as_array().unwrap();
    let sessions: Vec<u64> = filters
        .iter()
        .map(|f| f["sessions"].as_u64().unwrap())
        .collect();
    assert_eq!(sessions, [2, 1, 1, 2, 1, 0, 1], "{shaper}");
    let each_state = scenario(&shaper, "each");
    assert_eq!(each_state["mode"], "fixed");
    assert!(
        each_state["bytes"].as_u64().unwrap() >= 2_000_000,
        "{each_state}"
    );
    assert_eq!(
        filters[1]["matches"],
        format!("destination_port={}", near.port())
    );
    let status = api(&lab, "/api/v1/status");
    assert_eq!(status["totals"]["sessions_opened"]["direct"], 4, "{status}");
    assert_eq!(status["totals"]["sessions_opened"]["tunnel"], 2, "{status}");
    let (status, metrics) =
        wsx_e2e::api_request(&lab, Node::GwA, (API, TOKEN), ("GET", "/metrics"), None);
    assert_eq!(status, 200);
    assert!(
        metrics.contains("wsx_scenario_discarded_total{scenario=\"blocked\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("wsx_scenario_bytes_total{scenario=\"bulk\"}"),
        "{metrics}"
    );

    // A reload while a session runs: bulk goes from 8 to 30 Mbit/s; the session goes on
    // and completes intact.
    let live = std::thread::scope(|scope| {
        let run = scope.spawn(|| {
            transfer_through(
                &lab,
                Node::Client,
                later_sink,
                bulk_later,
                1,
                6_000_000,
                random,
            )
        });
        std::thread::sleep(Duration::from_secs(2));
        std::fs::write(&gw_a.config, gw_a_config(30)).unwrap();
        gw_a.signal(libc::SIGHUP);
        gw_a.wait_for("shaper reconfigured", Duration::from_secs(10));
        run.join().unwrap()
    });
    assert_eq!(
        live, 6_000_000,
        "the session that spanned the reload is intact"
    );
    let shaper = api(&lab, "/api/v1/shaper");
    let bulk_state = scenario(&shaper, "bulk");
    assert_eq!(bulk_state["max_rate_bps"], 30_000_000);
    // The session moved to the new tree: its flow is counted there.
    assert!(bulk_state["bytes"].as_u64().unwrap() > 0, "{bulk_state}");

    // Scenarios and filters edited one at a time through the API: saved to the file (the
    // rest of it as it was) and applied at once.
    let (status, answer) = send(
        &lab,
        "PUT",
        "/api/v1/shaper/scenarios/extra",
        Some(serde_json::json!({"max_rate": "5 Mbit/s", "priority": 6})),
    );
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = send(
        &lab,
        "POST",
        "/api/v1/shaper/filters?at=0",
        Some(serde_json::json!({"scenario": "extra", "destination_port": [9]})),
    );
    assert_eq!(status, 200, "{answer}");
    let shaper = api(&lab, "/api/v1/shaper");
    assert_eq!(scenario(&shaper, "extra")["max_rate_bps"], 5_000_000);
    assert_eq!(shaper["filters"][0]["matches"], "destination_port=9");
    let file = std::fs::read_to_string(&gw_a.config).unwrap();
    assert!(
        file.contains("name = \"extra\"") && file.contains("[api]"),
        "{file}"
    );
    // A filter that names a scenario that is not there: refused at its line and column,
    // nothing changed.
    let (status, answer) = send(
        &lab,
        "PUT",
        "/api/v1/shaper/filters/0",
        Some(serde_json::json!({"scenario": "nothing"})),
    );
    assert_eq!(status, 422, "{answer}");
    assert!(answer["error"]["line"].as_u64().is_some(), "{answer}");
    assert_eq!(std::fs::read_to_string(&gw_a.config).unwrap(), file);
    let (status, _) = send(&lab, "DELETE", "/api/v1/shaper/filters/0", None);
    assert_eq!(status, 200);
    let (status, _) = send(&lab, "DELETE", "/api/v1/shaper/scenarios/extra", None);
    assert_eq!(status, 200);
    let (status, _) = send(&lab, "DELETE", "/api/v1/shaper/scenarios/extra", None);
    assert_eq!(status, 404);
    let shaper = api(&lab, "/api/v1/shaper");
    assert!(
        !shaper["scenarios"].to_string().contains("extra"),
        "{shaper}"
    );
    assert_eq!(shaper["filters"].as_array().unwrap().len(), 7);

    // Off by a reload (the file without the shaper's tables): the API says so, and a
    // session to bulk's port goes through unshaped.
    let reloaded = |daemon: &Daemon, text: String| {
        let done = daemon.count("configuration reloaded");
        std::fs::write(&daemon.config, text).unwrap();
        daemon.signal(libc::SIGHUP);
        daemon.wait_for_count("configuration reloaded", done + 1, Duration::from_secs(10));
    };
    reloaded(&gw_a, c.gw_a.clone() + &api_section);
    gw_a.wait_for("shaper off", Duration::from_secs(1));
    let (status, answer) = send(&lab, "GET", "/api/v1/shaper", None);
    assert_eq!(status, 404, "{answer}");
    // bulk's port again (its first listener is gone with its transfer).
    let rebind = || {
        lab.run_in(Node::Server, move || TcpListener::bind(bulk))
            .unwrap()
            .unwrap()
    };
    assert_eq!(
        transfer_through(&lab, Node::Client, rebind(), bulk, 1, 1_000_000, random),
        1_000_000
    );
    // On again: the tunnel in service is handed back to the shaper, which never saw the
    // session of while it was off; a new session is shaped again.
    reloaded(&gw_a, gw_a_config(30));
    let shaper = api(&lab, "/api/v1/shaper");
    assert_eq!(scenario(&shaper, "bulk")["bytes"], 0, "{shaper}");
    assert_eq!(
        transfer_through(&lab, Node::Client, rebind(), bulk, 1, 1_000_000, random),
        1_000_000
    );
    let shaper = api(&lab, "/api/v1/shaper");
    let bulk_state = scenario(&shaper, "bulk");
    assert!(
        bulk_state["bytes"].as_u64().unwrap() >= 1_000_000,
        "{bulk_state}"
    );
}
