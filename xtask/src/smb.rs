//! `cargo xtask bench --smb-file-mib N`: an SMB file read across the lab, as issue 18's
//! benchmark has it. Samba (`wsx_lab::samba`) serves a file of N MiB in the server's
//! namespace; a client in the client's namespace (smbprotocol, from a virtual environment
//! under `target/tools`) reads it keeping exactly one READ of `--smb-read-kib` outstanding,
//! the way a file client that waits for each answer does, and the file's SHA-256 is checked.
//!
//! Modes: direct-cubic and direct-bbr (plain TCP, the namespaces' congestion control set
//! to it, if the host allows it there) and wsx (both gateways intercepting; Samba and the
//! client keep the namespaces' default congestion control, recorded). The figure to read is the time per READ in
//! round trips, and the rate it gives.

use crate::bench::{Mode, append_json_line, tempdir};
use crate::gateway::{Pair, Settings};
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use wsx_lab::samba::Samba;
use wsx_lab::traffic::{Payload, PayloadKind};
use wsx_lab::{Lab, Node, WanSpec, addr};

/// The smbprotocol release the client was written against.
const SMBPROTOCOL: &str = "smbprotocol==1.17.0";

/// One case.
#[derive(Clone, Debug)]
pub(crate) struct SmbCase {
    pub(crate) mode: Mode,
    pub(crate) wan: WanSpec,
    pub(crate) ipv6: bool,
    pub(crate) file_bytes: usize,
    pub(crate) read_bytes: usize,
    /// The dialect the client asks for, e.g. 0x0210.
    pub(crate) dialect: u16,
    pub(crate) gateways: Settings,
    pub(crate) wsx_binary: Option<PathBuf>,
}

/// Its record (a JSON line).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SmbRecord {
    pub(crate) mode: Mode,
    /// The congestion control of the namespaces' sockets (Samba's and the client's).
    pub(crate) cc: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) wsx_binary: Option<PathBuf>,
    pub(crate) ip: &'static str,
    pub(crate) rtt_ms: f64,
    pub(crate) loss_pct: f64,
    pub(crate) rate_mbit: f64,
    pub(crate) dialect: String,
    pub(crate) file_bytes: usize,
    pub(crate) read_bytes: usize,
    /// Connect, negotiate, session, tree and CREATE, seconds.
    pub(crate) setup_s: f64,
    /// The READs, one after another, seconds.
    pub(crate) read_s: f64,
    pub(crate) reads: usize,
    pub(crate) mbit_s: f64,
    /// The mean and the slowest READ, in round trips.
    pub(crate) read_rtt: f64,
    pub(crate) slowest_read_rtt: f64,
    /// The client asked for signing (smbprotocol's view of the session).
    pub(crate) signing: bool,
    /// What each gateway's observer judged the session (wsx mode).
    pub(crate) gateway_verdict: Option<String>,
    pub(crate) cpu_s_gw_a: Option<f64>,
    pub(crate) cpu_s_gw_b: Option<f64>,
    /// The file read matched the file served (SHA-256), whole.
    pub(crate) verified: bool,
}

/// Runs every case and prints and records the results.
pub(crate) fn run(cases: &[SmbCase], binary: &Path, json: Option<&Path>) -> Result<()> {
    crate::host::ensure(&[("smbd", "samba")])?;
    let python = crate::host::python_tool(SMBPROTOCOL)?.join("bin/python");
    let out_dir = crate::workspace_root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let mut records = Vec::new();
    for case in cases {
        let record = run_case(case, binary, &python)
            .with_context(|| format!("{} {:?}", case.mode.label(), case.wan))?;
        println!("{}", record.summary());
        if let Some(path) = json {
            append_json_line(path, &serde_json::to_string(&record)?)?;
        }
        records.push(record);
        std::fs::write(out_dir.join("smb.md"), markdown_table(&records))?;
    }
    println!("{}", markdown_table(&records));
    if let Some(bad) = records.iter().find(|r| !r.verified) {
        bail!("SMB read not verified: {}", bad.summary());
    }
    Ok(())
}

/// What the client prints.
#[derive(Debug, Deserialize)]
struct ClientReport {
    bytes: usize,
    sha256: String,
    setup_s: f64,
    read_s: f64,
    reads: usize,
    slowest_read_s: f64,
    signing: bool,
}

fn run_case(case: &SmbCase, binary: &Path, python: &Path) -> Result<SmbRecord> {
    let lab = Lab::start(&case.wan.emulator_config())?;
    let work = tempdir(&lab)?;
    let cc = match case.mode {
        Mode::DirectBbr => "bbr",
        Mode::DirectCubic => "cubic",
        _ => "",
    };
    let cc = set_congestion(&lab, cc)?;
    let gateways = match case.mode {
        Mode::Wsx => Some(Pair::start_binary(
            &lab,
            &work,
            binary,
            case.wsx_binary.as_deref(),
            case.gateways,
            None,
        )?),
        Mode::DirectCubic | Mode::DirectBbr => None,
        other => bail!(
            "--smb-file-mib runs in wsx, direct-cubic and direct-bbr, not {}",
            other.label()
        ),
    };
    let server = addr::server(case.ipv6);
    let samba = Samba::start(&lab, Node::Server, &[server], &work.join("samba"))?;
    let mut file = vec![0; case.file_bytes];
    Payload::new(PayloadKind::Random, 18, 0).fill(&mut file);
    std::fs::write(samba.share_dir().join("file.bin"), &file)?;
    let want = hex(ring::digest::digest(&ring::digest::SHA256, &file).as_ref());
    drop(file);

    let script = work.join("smb_read.py");
    std::fs::write(&script, include_str!("smb_read.py"))?;
    let out = lab
        .command(Node::Client, python)
        .arg(&script)
        .args([
            &server.to_string(),
            "pub",
            "file.bin",
            &case.read_bytes.to_string(),
            &format!("{:#06x}", case.dialect),
            "root",
            Samba::PASSWORD,
        ])
        .output()
        .context("running the SMB client")?;
    let usage = match gateways {
        Some(g) => {
            let smb = g.status(&lab, Node::GwA)?["smb"].clone();
            Some((g.stop(&lab)?, verdict(&smb)))
        }
        None => None,
    };
    drop(samba);
    drop(lab);
    let _ = std::fs::remove_dir_all(&work);
    if !out.status.success() {
        bail!(
            "the SMB client failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let report: ClientReport = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "the client's report: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })?;
    let rtt_s = case.wan.rtt_ms / 1e3;
    let reads = report.reads.max(1) as f64;
    Ok(SmbRecord {
        mode: case.mode,
        cc,
        wsx_binary: case.wsx_binary.clone(),
        ip: if case.ipv6 { "ipv6" } else { "ipv4" },
        rtt_ms: case.wan.rtt_ms,
        loss_pct: case.wan.loss_pct,
        rate_mbit: case.wan.rate_mbit,
        dialect: format!("{:#06x}", case.dialect),
        file_bytes: case.file_bytes,
        read_bytes: case.read_bytes,
        setup_s: report.setup_s,
        read_s: report.read_s,
        reads: report.reads,
        mbit_s: report.bytes as f64 * 8.0 / report.read_s / 1e6,
        read_rtt: report.read_s / reads / rtt_s,
        slowest_read_rtt: report.slowest_read_s / rtt_s,
        signing: report.signing,
        gateway_verdict: usage.as_ref().map(|(_, v)| v.clone()),
        cpu_s_gw_a: usage.as_ref().map(|([(a, _), _], _)| a.user_s + a.sys_s),
        cpu_s_gw_b: usage.as_ref().map(|([_, (b, _)], _)| b.user_s + b.sys_s),
        verified: report.bytes == case.file_bytes && report.sha256 == want,
    })
}

/// Sets the congestion control of new sockets in the client's and the server's namespaces
/// to `wanted` (none: leaves the default) and returns the one in effect. Samba and the
/// client are not ours to set it per socket. Outside the initial namespace only the
/// algorithms in `net.ipv4.tcp_allowed_congestion_control` may be set.
fn set_congestion(lab: &Lab, wanted: &str) -> Result<String> {
    let key = "net.ipv4.tcp_congestion_control";
    let current = |node| -> Result<String> {
        let out = lab.command(node, "sysctl").args(["-n", key]).output()?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    for node in [Node::Client, Node::Server] {
        if wanted.is_empty() || current(node)? == wanted {
            continue;
        }
        let out = lab
            .command(node, "sysctl")
            .args(["-qw", &format!("{key}={wanted}")])
            .output()?;
        if !out.status.success() {
            let allowed =
                std::fs::read_to_string("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
                    .unwrap_or_default();
            bail!(
                "cannot make {wanted} the namespaces' congestion control (allowed here: {}); \
                 add it to net.ipv4.tcp_allowed_congestion_control or choose another mode",
                allowed.trim()
            );
        }
    }
    current(Node::Server)
}

/// What gw-a's observer said of the one session, from its status's `smb`.
fn verdict(smb: &serde_json::Value) -> String {
    let passed: Vec<String> = smb["passed_through"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, n)| n.as_u64().unwrap_or(0) > 0)
        .map(|(why, _)| format!("passed through ({why})"))
        .collect();
    match (smb["unsigned"].as_u64(), passed.is_empty()) {
        (_, false) => passed.join(", "),
        (Some(n), true) if n > 0 => "unsigned".to_owned(),
        _ => format!("not judged ({smb})"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

impl SmbRecord {
    fn summary(&self) -> String {
        format!(
            "{}: {} ms {} % {} Mbit/s, {} MiB in {} KiB READs ({}): {:.2} Mbit/s, {:.3} RTT per READ (slowest {:.2}), setup {:.2} s{}{}",
            self.mode.label(),
            self.rtt_ms,
            self.loss_pct,
            self.rate_mbit,
            self.file_bytes >> 20,
            self.read_bytes >> 10,
            self.dialect,
            self.mbit_s,
            self.read_rtt,
            self.slowest_read_rtt,
            self.setup_s,
            self.gateway_verdict
                .as_ref()
                .map_or(String::new(), |v| format!(", gateways: {v}")),
            if self.verified { "" } else { " NOT VERIFIED" },
        )
    }
}

fn markdown_table(records: &[SmbRecord]) -> String {
    let mut out = String::from(
        "| system | RTT ms | loss % | Mbit/s | dialect | file MiB | READ KiB | READs | read s | Mbit/s | RTT per READ | slowest READ RTT | gw-a CPU s | gw-b CPU s | verified |\n\
         |---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    let cpu = |s: Option<f64>| s.map_or("–".into(), |s| format!("{s:.2}"));
    for r in records {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.2} | {:.3} | {:.2} | {} | {} | {} |",
            r.mode.label(),
            r.rtt_ms,
            r.loss_pct,
            r.rate_mbit,
            r.dialect,
            r.file_bytes >> 20,
            r.read_bytes >> 10,
            r.reads,
            r.read_s,
            r.mbit_s,
            r.read_rtt,
            r.slowest_read_rtt,
            cpu(r.cpu_s_gw_a),
            cpu(r.cpu_s_gw_b),
            if r.verified { "yes" } else { "NO" },
        );
    }
    out
}
