//! The management API and the CLI against real gateways in the lab: live sessions seen and
//! killed, bypass forced and lifted, metrics moving with the traffic, requests served during
//! a transfer, a configuration applied, saved and surviving a restart, a property-based
//! API tester (schemathesis) finding no server errors, and the dashboard in a real browser.
//! Every transfer is verified by hash.
//! Needs root; run with `cargo xtask test`.

// Test code: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use serde_json::Value;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use wsx_e2e::{Daemon, configs_with, listen, transfer, wait_for_tunnel, wait_until};
use wsx_lab::{Lab, Node, addr};
use wsx_tunnel::SecretKey;

const TOKEN: &str = "e2e-api-token-0123456789";
/// gw-a's API, inside its namespace.
const API: &str = "127.0.0.1:9180";

fn api_section() -> String {
    format!("\n[api]\nlisten = \"{API}\"\ntokens = [\"{TOKEN}\"]\n")
}

/// Both gateways, gw-a with its API on.
fn gateways(lab: &Lab, dir: &std::path::Path) -> (Daemon, Daemon) {
    let c = configs_with(&SecretKey::generate(), &SecretKey::generate());
    let gw_a = Daemon::start(lab, Node::GwA, dir, &(c.gw_a + &api_section()));
    let gw_b = Daemon::start(lab, Node::GwB, dir, &c.gw_b);
    gw_a.wait_for("API listening", Duration::from_secs(10));
    wait_for_tunnel(&gw_a, &gw_b, 1);
    (gw_a, gw_b)
}

fn lab() -> (Lab, PathBuf) {
    let lab = wsx_e2e::gateway_lab();
    let dir = wsx_e2e::config_dir(&lab);
    (lab, dir)
}

/// An HTTP request to gw-a's API from inside its namespace: the status and the body.
fn request(lab: &Lab, method: &str, path: &str, body: Option<(&str, String)>) -> (u16, String) {
    wsx_e2e::api_request(lab, Node::GwA, (API, TOKEN), (method, path), body)
}

fn get_json(lab: &Lab, path: &str) -> Value {
    let (status, body) = request(lab, "GET", path, None);
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// Runs the CLI in gw-a's namespace against its API.
fn cli(lab: &Lab, args: &[&str]) -> Output {
    lab.command(Node::GwA, wsx_e2e::wsx_binary())
        .args(args)
        .args(["--api", &format!("http://{API}"), "--token", TOKEN])
        .output()
        .unwrap()
}

fn cli_json(lab: &Lab, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = cli(lab, &all);
    assert!(out.status.success(), "wsx {args:?}: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The value of a sample line in Prometheus text, e.g.
/// `wsx_session_bytes_total{peer="gw-b",route="tunnel",direction="from_client"}`.
fn metric(text: &str, sample: &str) -> f64 {
    sample_value(text, sample).unwrap_or_else(|| panic!("no sample {sample} in\n{text}"))
}

fn sample_value(text: &str, sample: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
}

/// A client connection through gw-a to a server that reads what comes until the end; the
/// server's byte count as it reads, and its thread, which returns how the stream ended.
fn held_session(
    lab: &Lab,
) -> (
    TcpStream,
    Arc<AtomicUsize>,
    std::thread::JoinHandle<ErrorKind>,
) {
    let (listener, target) = listen(lab, Node::Server, addr::server(false));
    let read = Arc::new(AtomicUsize::new(0));
    let counter = read.clone();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 65536];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return ErrorKind::UnexpectedEof,
                Ok(n) => counter.fetch_add(n, Ordering::Relaxed),
                Err(e) => return e.kind(),
            };
        }
    });
    let client = lab
        .run_in(Node::Client, move || TcpStream::connect(target))
        .unwrap()
        .unwrap();
    (client, read, server)
}

#[test]
fn the_cli_sees_live_sessions_and_kills_one_and_metrics_move_with_traffic() {
    let (lab, dir) = lab();
    let (_gw_a, _gw_b) = gateways(&lab, &dir);
    let bytes_sample =
        "wsx_session_bytes_total{peer=\"gw-b\",route=\"tunnel\",direction=\"from_client\"}";
    let before = request(&lab, "GET", "/metrics", None).1;
    // No session yet: no sample for the peer's traffic, or whatever earlier ones left.
    let from_client_before = sample_value(&before, bytes_sample).unwrap_or(0.0);

    let (mut client, server_read, server) = held_session(&lab);
    let data = wsx_e2e::pseudo_random(300_000, 11);
    client.write_all(&data).unwrap();
    // All of it across: gw-a acknowledges the client at once, so the client's write says
    // nothing about what reached the server.
    wait_until(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || match server_read.load(Ordering::Relaxed) {
            n if n == data.len() => Ok(()),
            n => Err(format!("the server has {n} bytes")),
        },
    );
    // The session shows in `wsx sessions` with what the client sent so far.
    let session = wait_until(Duration::from_secs(10), Duration::from_millis(200), || {
        let page = cli_json(&lab, &["sessions", "--route", "tunnel"]);
        let s = page["sessions"]
            .as_array()
            .and_then(|list| {
                list.iter().find(|s| {
                    s["destination"]
                        .as_str()
                        .unwrap_or("")
                        .starts_with(&addr::server(false).to_string())
                })
            })
            .cloned();
        match s {
            Some(s) if s["bytes_from_client"].as_u64() == Some(data.len() as u64) => Ok(s),
            other => Err(format!("{other:?} in {page}")),
        }
    });
    assert_eq!(session["peer"], "gw-b");
    assert_eq!(session["state"], "open");
    let status = cli_json(&lab, &["status"]);
    assert!(status["sessions"]["tunnel"].as_u64() >= Some(1), "{status}");
    assert_eq!(status["peers"][0]["name"], "gw-b");
    assert_eq!(status["peers"][0]["healthy"], true);
    // The tunnel seals with the cipher both gateways' CPUs run fastest (the same CPU here).
    let peers = cli_json(&lab, &["peers"]);
    let cipher = if wsx_tunnel::hardware_aes() {
        "aes-256-gcm"
    } else {
        "chacha20-poly1305"
    };
    assert_eq!(peers[0]["tunnel"]["cipher"], cipher, "{peers}");
    // What the open-file limit carries: limit - 64 of this process's limit, which the
    // daemon raised to the hard one (20,000 here, or whatever the host allows).
    let capacity = status["session_capacity"].as_u64().unwrap();
    assert!(capacity >= 400, "{status}");
    assert_eq!(status["max_sessions"], 100_000, "{status}");
    // The human table lists it too.
    let table = cli(&lab, &["sessions"]);
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(table.contains(&format!("{} ", session["id"])), "{table}");

    // Killing it resets both ends.
    let id = session["id"].as_u64().unwrap().to_string();
    let out = cli(&lab, &["session", "kill", &id]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(server.join().unwrap(), ErrorKind::ConnectionReset);
    let mut buf = [0u8; 16];
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let client_end = client.read(&mut buf).map_err(|e| e.kind());
    assert_eq!(client_end, Err(ErrorKind::ConnectionReset));
    let out = cli(&lab, &["session", "kill", &id]);
    assert!(
        !out.status.success(),
        "a dead session cannot be killed twice"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("404"),
        "{out:?}"
    );

    // Metrics moved by what crossed.
    assert_eq!(
        transfer(&lab, Node::Client, Node::Server, false, 2, 1_000_000),
        2_000_000
    );
    let after = wait_until(Duration::from_secs(5), Duration::from_millis(200), || {
        let text = request(&lab, "GET", "/metrics", None).1;
        let moved = metric(&text, bytes_sample) - from_client_before;
        if moved >= (2_000_000 + data.len()) as f64 {
            Ok(text)
        } else {
            Err(format!("moved {moved}"))
        }
    });
    assert!(metric(&after, "wsx_sessions_ended_total{outcome=\"killed\"}") >= 1.0);
    assert!(metric(&after, "wsx_sessions_opened_total{route=\"tunnel\"}") >= 3.0);
    let intercepted = "wsx_sessions_entered_total{entry=\"intercepted\",listener=\"\"}";
    assert!(metric(&after, intercepted) >= 3.0);
    assert_eq!(metric(&after, "wsx_peer_up{peer=\"gw-b\"}"), 1.0);
    assert!(metric(&after, "wsx_tunnel_packets_sent_total{peer=\"gw-b\"}") > 1000.0);
    assert_eq!(metric(&after, "wsx_session_capacity{}"), capacity as f64);
    assert!(metric(&after, "wsx_tunnel_rtt_seconds{peer=\"gw-b\"}") > 0.03);
    assert!(
        metric(
            &after,
            "wsx_compression_plain_bytes_total{peer=\"gw-b\",direction=\"sent\"}"
        ) >= 2_000_000.0
    );
}

#[test]
fn bypass_forced_through_the_api_sends_new_sessions_direct_until_lifted() {
    let (lab, dir) = lab();
    let (gw_a, _gw_b) = gateways(&lab, &dir);
    let out = cli(&lab, &["bypass", "on", "gw-b"]);
    assert!(out.status.success(), "{out:?}");
    let peers = cli_json(&lab, &["peers"]);
    assert_eq!(peers[0]["bypass_forced"], true, "{peers}");
    assert_eq!(
        transfer(&lab, Node::Client, Node::Server, false, 1, 500_000),
        500_000
    );
    assert_eq!(gw_a.sessions("bypass"), 1);
    assert_eq!(gw_a.sessions("tunnel"), 0);
    let out = cli(&lab, &["bypass", "off", "gw-b"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        transfer(&lab, Node::Client, Node::Server, false, 1, 500_000),
        500_000
    );
    assert_eq!(gw_a.sessions("tunnel"), 1);
    let out = cli(&lab, &["bypass", "on", "nobody"]);
    assert!(!out.status.success());
}

#[test]
fn concurrent_requests_during_a_transfer_are_all_served() {
    let (lab, dir) = lab();
    let (_gw_a, _gw_b) = gateways(&lab, &dir);
    let lab = Arc::new(lab);
    let traffic = {
        let lab = lab.clone();
        std::thread::spawn(move || transfer(&lab, Node::Client, Node::Server, false, 8, 5_000_000))
    };
    let askers: Vec<_> = (0..8)
        .map(|i| {
            let lab = lab.clone();
            std::thread::spawn(move || {
                let paths = [
                    "/api/v1/status",
                    "/api/v1/sessions?limit=1000",
                    "/metrics",
                    "/api/v1/peers",
                ];
                for round in 0..25 {
                    let path = paths[(i + round) % paths.len()];
                    let (status, body) = request(&lab, "GET", path, None);
                    assert_eq!(status, 200, "{path}: {body}");
                }
            })
        })
        .collect();
    for a in askers {
        a.join().unwrap();
    }
    assert_eq!(traffic.join().unwrap(), 40_000_000);
}

#[test]
fn a_configuration_applied_through_the_api_is_saved_and_survives_a_restart() {
    let (lab, dir) = lab();
    let (mut gw_a, _gw_b) = gateways(&lab, &dir);
    let original = std::fs::read_to_string(&gw_a.config).unwrap();
    let view = get_json(&lab, "/api/v1/config");
    assert_eq!(view["config"]["tunnel"]["private_key"], "<secret>");
    assert_eq!(view["config"]["api"]["tokens"][0], "<secret>");
    assert!(!view.to_string().contains(TOKEN));
    assert_eq!(view["path"], gw_a.config.display().to_string());

    // A broken candidate is refused with the field and line, and nothing changes.
    let broken = original.replace("connect_timeout = \"3s\"", "connect_timeout = 3");
    let (status, body) = request(&lab, "PUT", "/api/v1/config", Some(("text/plain", broken)));
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 422, "{body}");
    assert_eq!(error["error"]["code"], "invalid_config");
    assert_eq!(error["error"]["field"], "sessions.connect_timeout");
    assert!(error["error"]["line"].as_u64().is_some(), "{body}");
    assert_eq!(std::fs::read_to_string(&gw_a.config).unwrap(), original);

    // A candidate that could not start (an API token too short) is refused too, though a
    // reload would not apply [api]: it would be saved for the next restart.
    let weak = original.replace(TOKEN, "short");
    let (status, body) = request(&lab, "PUT", "/api/v1/config", Some(("text/plain", weak)));
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("api.tokens"), "{body}");
    assert_eq!(std::fs::read_to_string(&gw_a.config).unwrap(), original);

    // A change only a restart can make is refused, and the file stays as it was.
    let moved = original.replace("listen = \"[::]:4500\"", "listen = \"[::]:4501\"");
    let (status, body) = request(&lab, "PUT", "/api/v1/config", Some(("text/plain", moved)));
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("needs_restart"), "{body}");
    assert_eq!(std::fs::read_to_string(&gw_a.config).unwrap(), original);
    // So is a new datagram size, which the running tunnel driver cannot take.
    let smaller = original.replace("[tunnel]\n", "[tunnel]\nmax_datagram = 1300\n");
    assert_ne!(smaller, original);
    let (status, body) = request(&lab, "PUT", "/api/v1/config", Some(("text/plain", smaller)));
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("max_datagram"), "{body}");
    assert_eq!(std::fs::read_to_string(&gw_a.config).unwrap(), original);

    // `wsx config check` and `apply` with a new session limit.
    let changed = original.replace("[sessions]\n", "[sessions]\nmax_sessions = 1234\n");
    let file = dir.join("candidate.toml");
    std::fs::write(&file, &changed).unwrap();
    let out = cli(&lab, &["config", "check", file.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::read_to_string(&gw_a.config).unwrap(), original);
    let out = cli(&lab, &["config", "apply", file.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    gw_a.wait_for("configuration applied and saved", Duration::from_secs(5));
    assert_eq!(std::fs::read_to_string(&gw_a.config).unwrap(), changed);
    let view = get_json(&lab, "/api/v1/config");
    assert_eq!(view["config"]["sessions"]["max_sessions"], 1234);
    assert_eq!(
        transfer(&lab, Node::Client, Node::Server, false, 1, 500_000),
        500_000
    );

    // A restart runs what was applied.
    assert!(gw_a.stop());
    let config = gw_a.config.clone();
    drop(gw_a);
    let gw_a = Daemon::start_with(&lab, Node::GwA, config);
    gw_a.wait_for("API listening", Duration::from_secs(10));
    let view = get_json(&lab, "/api/v1/config");
    assert_eq!(view["config"]["sessions"]["max_sessions"], 1234);
    // And the log level changes at runtime.
    let out = cli(&lab, &["log-level", "debug"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(get_json(&lab, "/api/v1/log-level")["filter"], "debug");
}

/// schemathesis generates requests from the OpenAPI document (valid and invalid) and checks
/// every answer against it; the daemon must never answer with a server error.
#[test]
fn a_property_based_api_tester_finds_no_server_errors() {
    let tester = std::env::var_os("WSX_SCHEMATHESIS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "set WSX_SCHEMATHESIS to the schemathesis program (cargo xtask test installs it)"
            )
        });
    let (lab, dir) = lab();
    let (_gw_a, _gw_b) = gateways(&lab, &dir);
    // A session for the session routes to find.
    let (mut client, _read, _server) = held_session(&lab);
    client.write_all(b"hello").unwrap();
    let out = lab
        .command(Node::GwA, &tester)
        .arg("--config-file")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/schemathesis.toml"))
        .args(["run", &format!("http://{API}/api/v1/openapi.json")])
        .args(["--header", &format!("Authorization: Bearer {TOKEN}")])
        .args(["--max-examples", "30"])
        // Its cache goes where it runs: the lab's directory, not the workspace.
        .current_dir(&dir)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis failed:\n{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The session may be gone: the stateful phase follows the document's links from the
    // session list to DELETE.
    drop(client);
}

/// The dashboard in a real browser: headless Chromium, driven through Selenium by
/// `tests/dashboard.py` from inside gw-a's namespace, while a transfer runs and a session
/// is held. A wrong token is refused; the right one shows gw-b up and the tunnel's rate
/// changing; the held session is killed from the table (its server sees the reset); the
/// page fits a phone. Screenshots land in `target/dashboard.png` and
/// `target/dashboard-phone.png`.
#[test]
fn the_dashboard_shows_the_pair_live_in_a_browser_and_kills_a_session() {
    let python = std::env::var_os("WSX_SELENIUM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "set WSX_SELENIUM_PYTHON to a Python with Selenium (cargo xtask test installs one)"
            )
        });
    let (lab, dir) = lab();
    let (_gw_a, _gw_b) = gateways(&lab, &dir);
    let (mut client, _read, server) = held_session(&lab);
    client.write_all(b"hello").unwrap();
    let kill_client = client.local_addr().unwrap().to_string();
    // Traffic for the charts while the browser looks: 45 s at up to 100 Mbit/s, time for a
    // browser slow to start on a busy machine to sign in and still see the rate change.
    let traffic = {
        let lab_name = lab.netns(Node::Client);
        let (listener, target) = listen(&lab, Node::Server, addr::server(false));
        std::thread::spawn(move || {
            let sink = std::thread::spawn(move || {
                wsx_lab::traffic::sink(
                    &listener,
                    wsx_lab::traffic::SinkOptions {
                        flows: 2,
                        idle_timeout: Duration::from_secs(30),
                    },
                )
            });
            let options = wsx_lab::traffic::SendOptions {
                to: target,
                flows: 2,
                bytes: None,
                seconds: 45.0,
                congestion: None,
                payload: wsx_lab::traffic::PayloadKind::Random,
                seed: 3,
                receipt_timeout: Duration::from_secs(60),
                rate_bps: None,
            };
            let sent = wsx_lab::netns::run_in(&lab_name, move || wsx_lab::traffic::send(&options))
                .unwrap()
                .unwrap();
            let received = sink.join().unwrap().unwrap();
            sent.verified() && received.verified()
        })
    };
    let screenshot = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/dashboard.png");
    let out = lab
        .command(Node::GwA, &python)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/dashboard.py"))
        .args(["--url", &format!("http://{API}/")])
        .args(["--token", TOKEN, "--kill-client", &kill_client])
        .args(["--screenshot", screenshot])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the browser test failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The kill reached the server's end of the held session.
    assert_eq!(server.join().unwrap(), ErrorKind::ConnectionReset);
    assert!(traffic.join().unwrap(), "the transfer was verified");
}
