//! The deployment guide (`deploy/README.md`), followed as written on two lab gateways that
//! run systemd: its shell blocks are run verbatim, the unit and the example configuration
//! are the ones in `deploy/`. Needs root; run with `cargo xtask test`.
//!
//! Both gateways are installed from the Debian package; at the end gw-a's is removed and
//! gw-a installed again from source. Two things differ from a real install: the package
//! and the binary are the ones `cargo xtask test` built from the debug build (the guide's
//! `cargo build --release` line is skipped), and the
//! configuration is the example with this lab's keys, addresses and prefixes filled in, the
//! step the guide leaves to the reader.

// Test code: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;
use wsx_e2e::{Machine, assert_no_rules, gateway_lab, toml_list, transfer, wait_until, wsx_binary};
use wsx_lab::{Node, addr};

/// The guide's fenced `sh` blocks, in order.
fn guide_blocks() -> Vec<String> {
    let guide = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/README.md");
    let text = std::fs::read_to_string(guide).unwrap();
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        match (&mut current, trimmed) {
            (None, "```sh") => current = Some(Vec::new()),
            (Some(lines), "```") => {
                blocks.push(lines.join("\n"));
                current = None;
            }
            // Blocks inside list items are indented; the shell does not mind.
            (Some(lines), _) => lines.push(line),
            (None, _) => {}
        }
    }
    blocks
}

/// The one block that contains `marker`.
fn block<'a>(blocks: &'a [String], marker: &str) -> &'a str {
    let found: Vec<&String> = blocks.iter().filter(|b| b.contains(marker)).collect();
    assert_eq!(found.len(), 1, "guide blocks with {marker:?}: {found:?}");
    found[0]
}

/// The example configuration, filled in for `node` as the guide asks: the key file, the
/// LAN interface, and the other gateway as the peer.
fn configuration(node: Node, peer_public_key: &str) -> String {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/wsx.toml");
    let example = std::fs::read_to_string(example).unwrap();
    // The example is written for gw-a of the lab's topology.
    for line in [
        "interfaces = [\"lan0\"]".to_owned(),
        format!("endpoint = \"{}:4500\"", addr::GWB_WAN_V4),
        format!("prefixes = {}", toml_list(&addr::server_lan())),
    ] {
        assert!(example.contains(&line), "the example has no {line:?}");
    }
    let fill = |text: String, from: &str, to: &str| {
        assert!(text.contains(from), "the example has no {from:?}");
        text.replace(from, to)
    };
    let mut config = fill(
        example,
        "private_key = \"REPLACE-WITH-THE-OUTPUT-OF-wsx-genkey\"",
        "private_key_file = \"/etc/wsx/private.key\"",
    );
    config = fill(config, "REPLACE-WITH-THE-PEERS-PUBLIC-KEY", peer_public_key);
    if node == Node::GwB {
        config = fill(config, "name = \"gw-b\"", "name = \"gw-a\"");
        config = fill(
            config,
            &addr::GWB_WAN_V4.to_string(),
            &addr::GWA_WAN_V4.to_string(),
        );
        config = fill(
            config,
            &toml_list(&addr::server_lan()),
            &toml_list(&addr::client_lan()),
        );
    }
    config
}

/// Waits until the unit is in `sub` state (`systemctl show -p SubState`).
fn wait_for_state(machine: &Machine, sub: &str, timeout: Duration) {
    wait_until(timeout, Duration::from_millis(20), || {
        let state = machine.sh_ok("systemctl show -p SubState --value wsx");
        if state.trim() == sub {
            Ok(())
        } else {
            Err(format!("wsx.service is {state:?}, not {sub:?}"))
        }
    });
}

#[test]
fn the_deployment_guide_works_under_systemd() {
    let blocks = guide_blocks();
    let prerequisites = block(&blocks, "modules-load.d");
    let from_package = block(&blocks, "dpkg -i");
    let from_source = block(&blocks, "useradd");
    let keys_and_token = block(&blocks, "wsx genkey");
    let enable = block(&blocks, "enable --now");
    let check = block(&blocks, "nft list table inet wsx");
    let package = std::env::var("WSX_DEB")
        .expect("WSX_DEB names the Debian package: run this through `cargo xtask test`");
    let from_package = from_package.replace("wsx_0.1.0-1_amd64.deb", &package);
    let binary = wsx_binary();
    let from_source = from_source
        .lines()
        .filter(|l| !l.trim_start().starts_with("cargo build"))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("target/release/wsx", binary.to_str().unwrap());

    let lab = gateway_lab();
    let nodes = [Node::GwA, Node::GwB];
    let machines = nodes.map(|node| Machine::boot(&lab, node));

    // Prerequisites, the package, the keys and the token; then each gateway's public key
    // for the other's [[peer]].
    for m in &machines {
        m.sh_ok(prerequisites);
        m.sh_ok(&from_package);
        m.sh_ok(keys_and_token);
    }
    let keys = machines.each_ref().map(|m| {
        m.sh_ok("wsx pubkey < /etc/wsx/private.key")
            .trim()
            .to_owned()
    });
    // What the package put in place, and what it did not start.
    let gw_a = &machines[0];
    assert_eq!(gw_a.sh_ok("command -v wsx").trim(), "/usr/bin/wsx");
    assert_eq!(
        gw_a.sh_ok("stat -c %U:%G:%a /etc/wsx").trim(),
        "root:wsx:770"
    );
    assert_eq!(gw_a.sh("systemctl is-enabled wsx").stdout, b"disabled\n");
    assert_eq!(gw_a.sh("systemctl is-active wsx").stdout, b"inactive\n");
    let pages = gw_a.sh_ok("ls /usr/share/man/man1");
    for page in [
        "wsx.1.gz",
        "wsx-run.1.gz",
        "wsx-check-config.1.gz",
        "wsx-sessions.1.gz",
    ] {
        assert!(pages.lines().any(|l| l == page), "no {page} in:\n{pages}");
    }
    let run_page = gw_a.sh_ok("zcat /usr/share/man/man1/wsx-run.1.gz");
    assert!(run_page.contains("Run the gateway"), "{run_page}");
    let bash = gw_a.sh_ok("cat /usr/share/bash-completion/completions/wsx");
    assert!(bash.contains("check-config"), "{bash}");
    for file in [
        "/usr/share/zsh/vendor-completions/_wsx",
        "/usr/share/fish/vendor_completions.d/wsx.fish",
        "/usr/share/doc/wsx/examples/wsx.toml",
        "/usr/share/doc/wsx/README.deploy.md",
    ] {
        gw_a.sh_ok(&format!("test -s {file}"));
    }
    for (i, m) in machines.iter().enumerate() {
        let config = configuration(nodes[i], &keys[1 - i]);
        m.sh_input("cat > /etc/wsx/wsx.toml", config.as_bytes());
        m.sh_ok(enable);
    }

    // "Check that it works", line by line as the guide gives it.
    for m in &machines {
        m.wait_for_journal("wsx", "tunnel in service", 1, Duration::from_secs(20));
        let out = m.sh_ok(check);
        for expected in [
            "active (running)",
            "tproxy ip to",
            "tproxy ip6 to",
            "0x7773",
            "local default",
            "tunnel address",
        ] {
            assert!(out.contains(expected), "no {expected:?} in:\n{out}");
        }
        // `wsx status`, through the API with the guide's token: the peer is up.
        assert!(
            out.lines()
                .any(|l| l.starts_with("gw-") && l.split_whitespace().nth(1) == Some("up")),
            "no peer up in:\n{out}"
        );
        // The unit runs wsx as its own user with only its three capabilities.
        let user = m.sh_ok("ps -o user= -C wsx");
        assert_eq!(user.trim(), "wsx");
    }
    for ipv6 in [false, true] {
        let bytes = transfer(&lab, Node::Client, Node::Server, ipv6, 2, 4 << 20);
        assert_eq!(bytes, 8 << 20);
    }
    let [gw_a, gw_b] = &machines;
    gw_a.wait_for_journal("wsx", "route=\"tunnel\"", 4, Duration::from_secs(30));
    gw_b.wait_for_journal("wsx", "route=\"inbound\"", 4, Duration::from_secs(30));

    // "Operate": reload keeps the service up; stop removes the rules.
    gw_a.sh_ok("systemctl reload wsx");
    gw_a.wait_for_journal("wsx", "configuration reloaded", 1, Duration::from_secs(10));
    gw_a.sh_ok("systemctl stop wsx");
    assert_no_rules(&lab, Node::GwA);
    transfer(&lab, Node::Client, Node::Server, false, 1, 1 << 20);
    gw_a.sh_ok("systemctl start wsx");
    gw_a.wait_for_journal("wsx", "tunnel in service", 2, Duration::from_secs(20));

    // A crash: ExecStopPost (`wsx cleanup`) has removed the rules by the time systemd waits
    // to restart the service; Restart=on-failure then brings it back.
    gw_a.sh_ok("systemctl kill --kill-whom=main --signal=SIGKILL wsx");
    wait_for_state(gw_a, "auto-restart", Duration::from_secs(10));
    assert_no_rules(&lab, Node::GwA);
    wait_for_state(gw_a, "running", Duration::from_secs(20));
    gw_a.wait_for_journal("wsx", "tunnel in service", 3, Duration::from_secs(20));
    let bytes = transfer(&lab, Node::Client, Node::Server, false, 1, 4 << 20);
    assert_eq!(bytes, 4 << 20);
    gw_a.wait_for_journal("wsx", "route=\"tunnel\"", 5, Duration::from_secs(30));

    // Removing the package stops the service (its rules go, traffic flows on) and keeps
    // the keys.
    gw_a.sh_ok("dpkg -r wsx");
    assert_eq!(gw_a.sh("systemctl is-active wsx").stdout, b"inactive\n");
    assert_no_rules(&lab, Node::GwA);
    gw_a.sh_ok("test -s /etc/wsx/private.key && ! test -e /usr/bin/wsx");
    let bytes = transfer(&lab, Node::Client, Node::Server, false, 1, 1 << 20);
    assert_eq!(bytes, 1 << 20);

    // The guide's other install, from source, on the same gateway: its keys and
    // configuration are still there.
    gw_a.sh_ok(&from_source);
    gw_a.sh_ok(enable);
    assert_eq!(gw_a.sh_ok("command -v wsx").trim(), "/usr/local/bin/wsx");
    gw_a.wait_for_journal("wsx", "tunnel in service", 4, Duration::from_secs(20));
    let bytes = transfer(&lab, Node::Client, Node::Server, false, 1, 4 << 20);
    assert_eq!(bytes, 4 << 20);
    gw_a.wait_for_journal("wsx", "route=\"tunnel\"", 6, Duration::from_secs(30));
}
