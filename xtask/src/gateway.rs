//! The wsx gateways of the `wsx` benchmark mode and the demo: a `wsx run` in gw-a and one
//! in gw-b, configured for each other, with their CPU time and peak memory read at the end.
//! The gateways' logs (with the tunnel's congestion events) are kept for every case as
//! `wsx-bench-logs/<lab>-gw{a,b}.log` in the temp directory. Each gateway runs its API on
//! its namespace's loopback; the tunnel's and compression's totals (packets, losses, FEC,
//! bytes) are read from it (`wsx peers --json`) just before the gateways stop.

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use wsx_lab::{Lab, Node, Usage, addr, usage_of};
use wsx_tunnel::SecretKey;

/// Forward error correction of what each gateway sends, as `fec` in wsx.toml.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Fec {
    Off,
    On,
    Adaptive,
}

impl Fec {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Fec::Off => "off",
            Fec::On => "on",
            Fec::Adaptive => "adaptive",
        }
    }
}

/// How both gateways treat their peer.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Settings {
    pub(crate) fec: Fec,
    pub(crate) compression: bool,
    /// gw-a's shaper holds the benchmark's sessions (to the sink's port) to this rate,
    /// kbit/s, in a scenario of their own under a root at the emulated WAN's rate.
    #[serde(default)]
    pub(crate) shape_kbit: Option<u64>,
    /// The tunnel's `max_rate_mbit` on both gateways (the operator's stated WAN rate).
    #[serde(default)]
    pub(crate) max_rate_mbit: Option<f64>,
    /// The tunnel's `max_datagram` on both gateways (the cap on path MTU discovery), if not
    /// the default.
    #[serde(default)]
    pub(crate) max_datagram: Option<u16>,
    /// SMB on the gateways' peers (`smb`): the observer and the read-ahead engine.
    #[serde(default = "yes")]
    pub(crate) smb: bool,
    /// `smb_read_ahead_mib` on both gateways' peers, if not the default.
    #[serde(default)]
    pub(crate) smb_read_ahead_mib: Option<u32>,
    /// `smb_validity_ms` on both gateways' peers, if not the default.
    #[serde(default)]
    pub(crate) smb_validity_ms: Option<u32>,
}

fn yes() -> bool {
    true
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            fec: Fec::Adaptive,
            compression: true,
            shape_kbit: None,
            max_rate_mbit: None,
            max_datagram: None,
            smb: true,
            smb_read_ahead_mib: None,
            smb_validity_ms: None,
        }
    }
}

/// Where each gateway's API listens, inside its own namespace (each has its own loopback).
const API_LISTEN: &str = "127.0.0.1:9180";

/// The API's token. The API is reachable only from inside the gateway's namespace of a lab
/// that lives for one case.
const API_TOKEN: &str = "wsx-bench-api-token-0123456789";

/// A gateway's figures, from its API (`GET /api/v1/peers`), summed over its peers (the
/// bench configures one): the counters of the tunnel in service (they start with the
/// tunnel) and of compression since the start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    /// Tunnel packets that carried data, control messages or PINGs, and those that carried
    /// only ACKs: together, the packets tracked for loss.
    pub(crate) data_packets_sent: u64,
    pub(crate) ack_only_packets_sent: u64,
    /// Tracked packets declared lost and sent again (those the peer rebuilt from parity
    /// are `fec_recovered_by_peer`).
    pub(crate) packets_lost: u64,
    pub(crate) fec_parity_sent: u64,
    /// Losses the peer rebuilt from parity.
    pub(crate) fec_recovered_by_peer: u64,
    pub(crate) fec_unrecoverable_groups: u64,
    /// Session bytes sent to the peer, and the stream bytes they took.
    pub(crate) plain_sent: u64,
    pub(crate) wire_sent: u64,
    /// The benchmark scenario of a shaping gateway: milliseconds its maximum held it back,
    /// and the bytes it sent.
    pub(crate) shaper_held_ms: Option<u64>,
    pub(crate) shaper_bytes: Option<u64>,
    /// The largest datagram size a tunnel was using at the end (path MTU discovery).
    pub(crate) datagram_bytes: u64,
    /// The cipher of the (last) tunnel.
    pub(crate) cipher: Option<String>,
}

impl Totals {
    /// The sums over the peers of the API's `GET /api/v1/peers` answer. Every peer must have
    /// a tunnel in service: a case whose tunnel is down at the end has no figures to give.
    fn from_peers_json(json: &[u8]) -> Result<Self> {
        let peers: Vec<ApiPeer> =
            serde_json::from_slice(json).context("parsing the API's list of peers")?;
        let mut totals = Self::default();
        for peer in peers {
            let Some(t) = peer.tunnel else {
                bail!("peer {:?} has no tunnel in service", peer.name);
            };
            totals.data_packets_sent += t.data_packets_sent;
            totals.ack_only_packets_sent += t.ack_only_packets_sent;
            totals.packets_lost += t.packets_lost;
            totals.fec_parity_sent += t.fec.parity_sent;
            totals.fec_recovered_by_peer += t.fec.recovered_by_peer;
            totals.fec_unrecoverable_groups += t.fec.unrecoverable_groups;
            totals.plain_sent += peer.compression.plain_sent;
            totals.wire_sent += peer.compression.wire_sent;
            totals.datagram_bytes = totals.datagram_bytes.max(t.datagram_bytes);
            totals.cipher = t.cipher.or(totals.cipher);
        }
        Ok(totals)
    }
}

/// The fields of the API's `Peer` (`wsx_api::model::Peer`) the bench reads; the others are
/// ignored.
#[derive(Debug, Deserialize)]
struct ApiPeer {
    name: String,
    tunnel: Option<ApiTunnel>,
    compression: ApiCompression,
}

#[derive(Debug, Deserialize)]
struct ApiTunnel {
    #[serde(default)]
    datagram_bytes: u64,
    #[serde(default)]
    cipher: Option<String>,
    data_packets_sent: u64,
    ack_only_packets_sent: u64,
    packets_lost: u64,
    fec: ApiFec,
}

#[derive(Debug, Deserialize)]
struct ApiFec {
    parity_sent: u64,
    recovered_by_peer: u64,
    unrecoverable_groups: u64,
}

#[derive(Debug, Deserialize)]
struct ApiCompression {
    plain_sent: u64,
    wire_sent: u64,
}

/// Both gateways, running.
#[derive(Debug)]
pub(crate) struct Pair {
    children: [Child; 2],
    work: PathBuf,
    /// The `wsx` binary, which also asks the gateways' APIs.
    wsx: PathBuf,
}

impl Pair {
    /// Starts `wsx` (found beside the lab binary) in gw-a and gw-b and waits until the
    /// tunnel between them carries sessions. With `forward` (listen, to), gw-a does not
    /// intercept but runs a forwarding listener.
    pub(crate) fn start(
        lab: &Lab,
        work: &Path,
        lab_binary: &Path,
        settings: Settings,
        forward: Option<(SocketAddr, SocketAddr)>,
    ) -> Result<Self> {
        Self::start_binary(lab, work, lab_binary, None, settings, forward)
    }

    /// Like [`Pair::start`], running the gateway binary `wsx` (another build) if given.
    pub(crate) fn start_binary(
        lab: &Lab,
        work: &Path,
        lab_binary: &Path,
        wsx: Option<&Path>,
        settings: Settings,
        forward: Option<(SocketAddr, SocketAddr)>,
    ) -> Result<Self> {
        let wsx = wsx.map_or_else(|| lab_binary.with_file_name("wsx"), Path::to_path_buf);
        let shaper = settings.shape_kbit.map(shaper_text);
        Self::launch(lab, work, wsx, settings, forward, shaper.as_deref())
    }

    /// Like [`Pair::start`] (intercepting), with `shaper` (the `[shaper]`, `[[scenario]]`
    /// and `[[filter]]` sections) in gw-a's configuration.
    pub(crate) fn start_shaped(
        lab: &Lab,
        work: &Path,
        lab_binary: &Path,
        settings: Settings,
        shaper: &str,
    ) -> Result<Self> {
        let wsx = lab_binary.with_file_name("wsx");
        Self::launch(lab, work, wsx, settings, None, Some(shaper))
    }

    fn launch(
        lab: &Lab,
        work: &Path,
        wsx: PathBuf,
        settings: Settings,
        forward: Option<(SocketAddr, SocketAddr)>,
        shaper: Option<&str>,
    ) -> Result<Self> {
        if !wsx.is_file() {
            bail!(
                "no wsx binary at {}: build it with `cargo build --release -p wsx`",
                wsx.display()
            );
        }
        let (a, b) = (SecretKey::generate(), SecretKey::generate());
        let nodes = [
            (
                Node::GwA,
                &a,
                &b,
                SocketAddr::from((addr::GWB_WAN_V4, 4500)),
                toml_list(&addr::server_lan()),
            ),
            (
                Node::GwB,
                &b,
                &a,
                SocketAddr::from((addr::GWA_WAN_V4, 4500)),
                toml_list(&addr::client_lan()),
            ),
        ];
        let mut children = Vec::new();
        let mut logs = Vec::new();
        for (node, own, peer, endpoint, remote) in nodes {
            let config = work.join(format!("{}.toml", node.role()));
            let mut text = config_text(own, peer, endpoint, &remote, settings);
            if let (Node::GwA, Some(shaper)) = (node, shaper) {
                text += shaper;
            }
            if let (Node::GwA, Some((listen, to))) = (node, forward) {
                text = text.replace("[intercept]\ninterfaces = [\"lan0\"]\n\n", "")
                    + &format!(
                        "\n[[forward]]\nname = \"bench\"\nlisten = \"{listen}\"\nto = \"{to}\"\npeer = \"peer\"\n"
                    );
            }
            std::fs::write(&config, text)?;
            let log = work.join(format!("{}.log", node.role()));
            std::fs::File::create(&log)?;
            children.push(spawn(lab, &wsx, node, &config, &log)?);
            logs.push(log);
        }
        let pair = Self {
            children: children
                .try_into()
                .map_err(|_| anyhow::anyhow!("two gateways"))?,
            work: work.to_path_buf(),
            wsx,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        for log in &logs {
            while !std::fs::read_to_string(log)?.contains("tunnel in service") {
                if Instant::now() > deadline {
                    bail!(
                        "the gateways' tunnel did not come up; see {}",
                        log.display()
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(pair)
    }

    /// Stops `node`'s gateway (SIGTERM: it drains its sessions for up to the drain
    /// timeout) and starts it again with the same configuration, its log appended to.
    pub(crate) fn restart(&mut self, lab: &Lab, node: Node) -> Result<()> {
        let i = usize::from(node == Node::GwB);
        let child = &mut self.children[i];
        // SAFETY: kill with our child's pid and a valid signal.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        child.wait()?;
        let config = self.work.join(format!("{}.toml", node.role()));
        let log = self.work.join(format!("{}.log", node.role()));
        self.children[i] = spawn(lab, &self.wsx, node, &config, &log)?;
        Ok(())
    }

    /// Reads each gateway's usage and, from its API, its totals; then stops them.
    pub(crate) fn stop(mut self, lab: &Lab) -> Result<[(Usage, Totals); 2]> {
        let usage = [
            usage_of(self.children[0].id())?,
            usage_of(self.children[1].id())?,
        ];
        let mut totals = [self.totals(lab, Node::GwA)?, self.totals(lab, Node::GwB)?];
        if let Some((held_ms, bytes)) = self.shaper(lab, Node::GwA)? {
            totals[0].shaper_held_ms = Some(held_ms);
            totals[0].shaper_bytes = Some(bytes);
        }
        for child in &mut self.children {
            // SAFETY: kill with our child's pid and a valid signal.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        }
        for child in &mut self.children {
            child.wait()?;
        }
        // The case's directory goes with its lab; the logs stay.
        let kept = std::env::temp_dir().join("wsx-bench-logs");
        std::fs::create_dir_all(&kept)?;
        let case = self
            .work
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("case");
        for n in ["gwa", "gwb"] {
            let log = self.work.join(format!("{n}.log"));
            let _ = std::fs::copy(&log, kept.join(format!("{case}-{n}.log")));
        }
        let [ua, ub] = usage;
        let [ta, tb] = totals;
        Ok([(ua, ta), (ub, tb)])
    }

    /// The gateways' process ids, gw-a's first.
    pub(crate) fn pids(&self) -> [u32; 2] {
        [self.children[0].id(), self.children[1].id()]
    }

    /// `node`'s status as its API gives it (`GET /api/v1/status` through `wsx status --json`).
    pub(crate) fn status(&self, lab: &Lab, node: Node) -> Result<serde_json::Value> {
        let output = self.ask(lab, node, "status")?;
        serde_json::from_slice(&output).with_context(|| format!("{node:?}'s status"))
    }

    /// `node`'s totals, from its API: `wsx peers --json` run in its namespace finds the
    /// address and the token in the gateway's configuration file.
    fn totals(&self, lab: &Lab, node: Node) -> Result<Totals> {
        let output = self.ask(lab, node, "peers")?;
        Totals::from_peers_json(&output).with_context(|| format!("{node:?}'s totals"))
    }

    /// What `wsx COMMAND --json`, run in `node`'s namespace against its API (address and
    /// token from the gateway's configuration file), prints.
    fn ask(&self, lab: &Lab, node: Node, command: &str) -> Result<Vec<u8>> {
        let config = self.work.join(format!("{}.toml", node.role()));
        let output = lab
            .command(node, &self.wsx)
            .args([command, "--json", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("asking {node:?}'s API (wsx {command})"))?;
        if !output.status.success() {
            bail!(
                "{node:?}'s API (wsx {command}): {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(output.stdout)
    }
}

impl Pair {
    /// The scenario "bench"'s time held at its maximum (ms) and bytes, if the node's shaper
    /// has one.
    fn shaper(&self, lab: &Lab, node: Node) -> Result<Option<(u64, u64)>> {
        let Some(shaper) = self.shaper_state(lab, node)? else {
            return Ok(None);
        };
        let Some(bench) = shaper["scenarios"]
            .as_array()
            .and_then(|all| all.iter().find(|s| s["name"] == "bench"))
        else {
            return Ok(None);
        };
        let held = bench["held_at_max_seconds"].as_f64().unwrap_or(0.0);
        let bytes = bench["bytes"].as_u64().unwrap_or(0);
        Ok(Some(((held * 1000.0).round() as u64, bytes)))
    }

    /// The node's shaper as its API shows it (`GET /api/v1/shaper` through `wsx filters
    /// --json`), if its configuration has one.
    pub(crate) fn shaper_state(&self, lab: &Lab, node: Node) -> Result<Option<serde_json::Value>> {
        let config = self.work.join(format!("{}.toml", node.role()));
        if !std::fs::read_to_string(&config)?.contains("[shaper]") {
            return Ok(None);
        }
        let output = self.ask(lab, node, "filters")?;
        let shaper = serde_json::from_slice(&output).context("parsing the shaper's state")?;
        Ok(Some(shaper))
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for child in &mut self.children {
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Starts `wsx run` in `node` with `config`, its log appended to `log`.
fn spawn(lab: &Lab, wsx: &Path, node: Node, config: &Path, log: &Path) -> Result<Child> {
    let log = std::fs::OpenOptions::new().append(true).open(log)?;
    lab.command(node, wsx)
        .arg("run")
        .arg("--config")
        .arg(config)
        // Congestion events are debug events of the tunnel: keep them for analysis.
        .env("WSX_LOG", "info,wsx_tunnel=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting wsx in {node:?}"))
}

pub(crate) fn config_text(
    own: &SecretKey,
    peer: &SecretKey,
    endpoint: SocketAddr,
    remote: &str,
    settings: Settings,
) -> String {
    let max_rate = settings
        .max_rate_mbit
        .map_or(String::new(), |m| format!("max_rate_mbit = {m:?}\n"))
        + &settings
            .max_datagram
            .map_or(String::new(), |d| format!("max_datagram = {d}\n"));
    let read_ahead = settings
        .smb_read_ahead_mib
        .map_or(String::new(), |m| format!("smb_read_ahead_mib = {m}\n"))
        + &settings
            .smb_validity_ms
            .map_or(String::new(), |m| format!("smb_validity_ms = {m}\n"));
    format!(
        "[tunnel]\nlisten = \"[::]:4500\"\nprivate_key = \"{}\"\n{max_rate}\n[intercept]\ninterfaces = [\"lan0\"]\n\n\
         [[peer]]\nname = \"peer\"\npublic_key = \"{}\"\nendpoint = \"{endpoint}\"\nprefixes = {remote}\n\
         compression = {}\nfec = \"{}\"\nsmb = {}\n{read_ahead}\n[api]\nlisten = \"{API_LISTEN}\"\ntokens = [\"{API_TOKEN}\"]\n",
        own.to_base64(),
        peer.public_key(),
        settings.compression,
        settings.fec.as_str(),
        settings.smb,
    )
}

/// gw-a's shaper: one scenario at `kbit` for the benchmark's sessions (to the sink's port
/// 5201), under a root that does not limit (the emulated WAN does).
fn shaper_text(kbit: u64) -> String {
    format!(
        "\n[shaper]\nwan_rate = \"10 Gbit/s\"\n\n[[scenario]]\nname = \"bench\"\nmax_rate = \"{kbit} kbit/s\"\n\n\
         [[filter]]\nscenario = \"bench\"\ndestination_port = [5201]\n"
    )
}

/// Prefix strings as a TOML array.
fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("\"{i}\"")).collect();
    format!("[{}]", quoted.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer of `GET /api/v1/peers` as the API gives it (two peers, every field).
    const PEERS: &str = r#"[
      {"name": "a", "endpoint": "10.71.2.2:4500", "prefixes": ["10.71.3.0/24"],
       "healthy": true, "bypass_forced": false, "tunnels": 1,
       "tunnel": {"remote": "10.71.2.2:4500", "rtt_seconds": 0.1, "min_rtt_seconds": 0.1,
                  "datagram_bytes": 1472, "mtu_black_holes": 0,
                  "congestion_phase": "optimal", "pacing_rate_bps": 100000000,
                  "bottleneck_rate_bps": 99000000, "packets_sent": 1200,
                  "data_packets_sent": 1000, "ack_only_packets_sent": 159,
                  "bytes_sent": 1400000, "packets_received": 300,
                  "bytes_received": 20000, "packets_lost": 10, "loss_ratio": 0.0155,
                  "unrepaired_loss_ratio": 0.0086,
                  "auth_failures": 0, "replays": 0,
                  "fec": {"blocks": 5, "packets_protected": 900, "parity_sent": 40,
                          "parity_bytes_sent": 56000, "overhead": 0.04,
                          "recovered_by_peer": 8, "parity_received": 0, "recovered": 0,
                          "unrecoverable_groups": 1, "decoder_bytes": 0}},
       "compression": {"plain_sent": 3000, "wire_sent": 1000, "ratio_sent": 0.333,
                       "chunks_deflated": 1, "chunks_incompressible": 0, "chunks_stored": 0,
                       "compress_cpu_seconds": 0.01, "wire_received": 0,
                       "plain_received": 0, "inflate_cpu_seconds": 0.0}},
      {"name": "b", "endpoint": null, "prefixes": [], "healthy": true,
       "bypass_forced": false, "tunnels": 1,
       "tunnel": {"remote": "10.71.2.3:4500", "rtt_seconds": 0.1, "min_rtt_seconds": 0.1,
                  "congestion_phase": null, "pacing_rate_bps": 0, "bottleneck_rate_bps": 0,
                  "packets_sent": 7, "data_packets_sent": 5, "ack_only_packets_sent": 1,
                  "bytes_sent": 700, "packets_received": 7, "bytes_received": 700,
                  "packets_lost": 1, "loss_ratio": 0.167, "unrepaired_loss_ratio": 0.167,
                  "auth_failures": 0, "replays": 0,
                  "fec": {"blocks": 0, "packets_protected": 0, "parity_sent": 0,
                          "parity_bytes_sent": 0, "overhead": 0.0, "recovered_by_peer": 0,
                          "parity_received": 0, "recovered": 0, "unrecoverable_groups": 0,
                          "decoder_bytes": 0}},
       "compression": {"plain_sent": 10, "wire_sent": 13, "ratio_sent": 1.3,
                       "chunks_deflated": 0, "chunks_incompressible": 0, "chunks_stored": 1,
                       "compress_cpu_seconds": 0.0, "wire_received": 0,
                       "plain_received": 0, "inflate_cpu_seconds": 0.0}}
    ]"#;

    #[test]
    fn totals_are_summed_over_the_peers_the_api_lists() {
        let totals = Totals::from_peers_json(PEERS.as_bytes()).unwrap_or_default();
        assert_eq!(
            totals,
            Totals {
                data_packets_sent: 1005,
                ack_only_packets_sent: 160,
                packets_lost: 11,
                fec_parity_sent: 40,
                fec_recovered_by_peer: 8,
                fec_unrecoverable_groups: 1,
                plain_sent: 3010,
                wire_sent: 1013,
                datagram_bytes: 1472,
                ..Totals::default()
            }
        );
    }

    #[test]
    fn a_peer_without_a_tunnel_or_a_bad_answer_is_an_error() {
        let down = PEERS.replacen("\"tunnel\": {", "\"tunnel\": null, \"old\": {", 1);
        let e = Totals::from_peers_json(down.as_bytes()).map_err(|e| e.to_string());
        assert_eq!(e, Err("peer \"a\" has no tunnel in service".to_string()));
        assert!(Totals::from_peers_json(b"{\"error\": \"unauthorized\"}").is_err());
        assert_eq!(Totals::from_peers_json(b"[]").ok(), Some(Totals::default()));
    }
}
