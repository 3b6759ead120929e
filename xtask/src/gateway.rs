//! The wsx gateways of the `wsx` benchmark mode and the demo: a `wsx run` in gw-a and one
//! in gw-b, configured for each other, with their CPU time and peak memory read at the end.
//! The gateways' logs (with the tunnel's congestion events) are kept for every case as
//! `wsx-bench-logs/<lab>-gw{a,b}.log` in the temp directory; the totals each logs at stop
//! (tunnel packets, losses, FEC, compression) are read back for the record.

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Settings {
    pub(crate) fec: Fec,
    pub(crate) compression: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            fec: Fec::Adaptive,
            compression: true,
        }
    }
}

/// The counters a gateway logs, by name, summed over its lines: `packets_lost`,
/// `fec_recovered_by_peer`... once per tunnel as it leaves service, `plain_sent`... per
/// peer at stop (`log_tunnel_totals`, `log_compression_totals` in wsx-proxy).
#[derive(Clone, Debug, Default)]
pub(crate) struct Totals(BTreeMap<String, u64>);

impl Totals {
    pub(crate) fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }

    /// The sums of the `key=value` numbers of a log's "totals" lines; `None` without any.
    fn from_log(log: &str) -> Option<Self> {
        let mut sums = BTreeMap::new();
        let mut lines = log.lines().filter(|l| l.contains(" totals ")).peekable();
        lines.peek()?;
        for line in lines {
            for token in line.split_whitespace() {
                let Some((key, value)) = token.split_once('=') else {
                    continue;
                };
                if let Ok(value) = value.parse::<u64>() {
                    *sums.entry(key.to_string()).or_default() += value;
                }
            }
        }
        Some(Self(sums))
    }
}

/// Both gateways, running.
#[derive(Debug)]
pub(crate) struct Pair {
    children: [Child; 2],
    work: std::path::PathBuf,
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
        let wsx = lab_binary.with_file_name("wsx");
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
            if let (Node::GwA, Some((listen, to))) = (node, forward) {
                text = text.replace("[intercept]\ninterfaces = [\"lan0\"]\n\n", "")
                    + &format!(
                        "\n[[forward]]\nname = \"bench\"\nlisten = \"{listen}\"\nto = \"{to}\"\npeer = \"peer\"\n"
                    );
            }
            std::fs::write(&config, text)?;
            let log = work.join(format!("{}.log", node.role()));
            let child = lab
                .command(node, &wsx)
                .arg("run")
                .arg("--config")
                .arg(&config)
                // Congestion events are debug events of the tunnel: keep them for analysis.
                .env("WSX_LOG", "info,wsx_tunnel=debug")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log)?)
                .spawn()
                .with_context(|| format!("starting wsx in {node:?}"))?;
            children.push(child);
            logs.push(log);
        }
        let pair = Self {
            children: children
                .try_into()
                .map_err(|_| anyhow::anyhow!("two gateways"))?,
            work: work.to_path_buf(),
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

    /// Reads each gateway's usage, then stops them and reads the totals they log.
    pub(crate) fn stop(mut self) -> Result<[(Usage, Totals); 2]> {
        let usage = [
            usage_of(self.children[0].id())?,
            usage_of(self.children[1].id())?,
        ];
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
        let mut totals = [Totals::default(), Totals::default()];
        for (n, totals) in ["gwa", "gwb"].into_iter().zip(&mut totals) {
            let log = self.work.join(format!("{n}.log"));
            *totals = Totals::from_log(&std::fs::read_to_string(&log)?)
                .with_context(|| format!("no totals in {}", log.display()))?;
            let _ = std::fs::copy(&log, kept.join(format!("{case}-{n}.log")));
        }
        let [ua, ub] = usage;
        let [ta, tb] = totals;
        Ok([(ua, ta), (ub, tb)])
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

fn config_text(
    own: &SecretKey,
    peer: &SecretKey,
    endpoint: SocketAddr,
    remote: &str,
    settings: Settings,
) -> String {
    format!(
        "[tunnel]\nlisten = \"[::]:4500\"\nprivate_key = \"{}\"\n\n[intercept]\ninterfaces = [\"lan0\"]\n\n\
         [[peer]]\nname = \"peer\"\npublic_key = \"{}\"\nendpoint = \"{endpoint}\"\nprefixes = {remote}\n\
         compression = {}\nfec = \"{}\"\n",
        own.to_base64(),
        peer.public_key(),
        settings.compression,
        settings.fec.as_str(),
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

    #[test]
    fn totals_are_summed_over_the_totals_lines() {
        let log = "2026-11-21T10:00:00Z  INFO peer{name=peer}: tunnel totals packets_sent=1 \
                   packets_lost=0\n\
                   2026-11-21T10:00:01Z  INFO peer{name=peer}: tunnel totals packets_sent=10 \
                   packets_lost=2 fec_recovered_by_peer=7\n\
                   2026-11-21T10:00:01Z  INFO compression totals peer=peer plain_sent=5\n\
                   2026-11-21T10:00:01Z  INFO wsx: stopped plain_sent=9\n";
        let totals = Totals::from_log(log).unwrap_or_default();
        assert_eq!(
            (totals.get("packets_sent"), totals.get("packets_lost")),
            (11, 2)
        );
        assert_eq!(totals.get("fec_recovered_by_peer"), 7);
        assert_eq!(totals.get("plain_sent"), 5);
        assert_eq!(totals.get("wire_sent"), 0);
        assert!(Totals::from_log("nothing here\n").is_none());
    }
}
