//! The wsx gateways of the `wsx` benchmark mode and the demo: a `wsx run` in gw-a and one
//! in gw-b, configured for each other, with their CPU time and peak memory read at the end.
//! The gateways' logs (with the tunnel's congestion events) are kept for every case as
//! `wsx-bench-logs/<lab>-gw{a,b}.log` in the temp directory.

use anyhow::{Context, Result, bail};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use wsx_lab::{Lab, Node, Usage, addr, usage_of};
use wsx_tunnel::SecretKey;

/// Both gateways, running.
#[derive(Debug)]
pub(crate) struct Pair {
    children: [Child; 2],
    work: std::path::PathBuf,
}

impl Pair {
    /// Starts `wsx` (found beside the lab binary) in gw-a and gw-b and waits until the
    /// tunnel between them carries sessions.
    pub(crate) fn start(lab: &Lab, work: &Path, lab_binary: &Path) -> Result<Self> {
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
            std::fs::write(&config, config_text(own, peer, endpoint, &remote))?;
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

    /// Reads each gateway's usage, then stops them.
    pub(crate) fn stop(mut self) -> Result<[Usage; 2]> {
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
        for n in ["gwa", "gwb"] {
            let _ = std::fs::copy(
                self.work.join(format!("{n}.log")),
                kept.join(format!("{case}-{n}.log")),
            );
        }
        Ok(usage)
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

fn config_text(own: &SecretKey, peer: &SecretKey, endpoint: SocketAddr, remote: &str) -> String {
    format!(
        "[tunnel]\nlisten = \"[::]:4500\"\nprivate_key = \"{}\"\n\n[intercept]\ninterfaces = [\"lan0\"]\n\n\
         [[peer]]\nname = \"peer\"\npublic_key = \"{}\"\nendpoint = \"{endpoint}\"\nprefixes = {remote}\n",
        own.to_base64(),
        peer.public_key()
    )
}

/// Prefix strings as a TOML array.
fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("\"{i}\"")).collect();
    format!("[{}]", quoted.join(", "))
}
