//! `cargo xtask bench --smb-file-mib N` / `--smb-files N`: SMB reads across the lab, as
//! issue 18's benchmark has them. Samba (`wsx_lab::samba`) serves the files in the server's
//! namespace; a client in the client's namespace reads them and their SHA-256 is checked:
//!
//! - `--smb-file-mib N`: one file of N MiB, read keeping exactly one READ of
//!   `--smb-read-kib` outstanding, the way a file client that waits for each answer does
//!   (smbprotocol, from a virtual environment under `target/tools`); with `--smb-client
//!   smbclient`, Samba's own client instead (`get`: several READs outstanding); with
//!   `--smb-client smbprotocol-share-write`, the one-READ client opening the file as one
//!   others may write, with no oplock (read ahead only within `--smb-validity-ms`).
//! - `--smb-files N`: N files of `--smb-file-kib` each, one after another in one session
//!   (CREATE, READs, CLOSE), by the one-READ client (`--smb-client smbprotocol-compound`:
//!   each CREATE compounded with a QUERY_INFO, as Windows opens files), or with
//!   `--smb-client smbclient` by smbclient's `get` (which asks a QUERY_INFO after each
//!   CREATE): files per second.
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
pub(crate) const SMBPROTOCOL: &str = "smbprotocol==1.17.0";

/// The client that reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Client {
    /// smbprotocol's low-level API: one READ outstanding.
    Smbprotocol,
    /// The same, each file opened as Windows opens one: CREATE and QUERY_INFO in one
    /// compound request.
    SmbprotocolCompound,
    /// The one-READ client opening each file letting others write it and asking no
    /// oplock or lease (as Samba's smbclient and most scripted clients open files): far
    /// reads such files ahead only within `--smb-validity-ms`.
    SmbprotocolShareWrite,
    /// Samba's smbclient (`get`): several READs outstanding.
    Smbclient,
    /// Samba's smbclient writing the file (`put`): several WRITEs outstanding.
    SmbclientPut,
}

/// One case.
#[derive(Clone, Debug)]
pub(crate) struct SmbCase {
    pub(crate) mode: Mode,
    pub(crate) wan: WanSpec,
    pub(crate) ipv6: bool,
    pub(crate) client: Client,
    /// Files read one after another, each of `file_bytes`.
    pub(crate) files: usize,
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
    pub(crate) client: Client,
    pub(crate) files: usize,
    pub(crate) file_bytes: usize,
    /// The one-READ client's READ size (smbclient chooses its own).
    pub(crate) read_bytes: usize,
    /// Connect, negotiate, session, tree and CREATE, seconds.
    pub(crate) setup_s: f64,
    /// The files' CREATEs, READs and CLOSEs, one after another, seconds.
    pub(crate) read_s: f64,
    pub(crate) reads: usize,
    pub(crate) mbit_s: f64,
    pub(crate) files_per_s: f64,
    /// The mean and the slowest READ (the wait for its answer), in round trips.
    pub(crate) read_rtt: f64,
    pub(crate) slowest_read_rtt: f64,
    /// smbprotocol's `signing_required` for the session (false for smbclient's guest).
    pub(crate) signing: bool,
    /// What each gateway's observer judged the session (wsx mode).
    pub(crate) gateway_verdict: Option<String>,
    /// The gateways ran SMB (`smb` on their peers; wsx mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) smb: Option<bool>,
    /// The gateways' `smb_validity_ms`, if set for this case (wsx mode with SMB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) smb_validity_ms: Option<u32>,
    /// Requests gw-a answered itself (READs and QUERY_INFOs from what gw-b sent ahead,
    /// CLOSEs), and the predictions gw-b's client did not use (wsx mode with SMB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) answered_locally: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) missed: Option<u64>,
    pub(crate) cpu_s_gw_a: Option<f64>,
    pub(crate) cpu_s_gw_b: Option<f64>,
    /// The gateways' peak resident set sizes, KiB (wsx modes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_rss_kb_gw_a: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_rss_kb_gw_b: Option<u64>,
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
    files: usize,
    reads: usize,
    /// Of `read_s`, the time spent waiting for READs.
    reads_s: f64,
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
            "the SMB cases run in wsx, direct-cubic and direct-bbr, not {}",
            other.label()
        ),
    };
    let server = addr::server(case.ipv6);
    let samba = Samba::start(&lab, Node::Server, &[server], &work.join("samba"))?;
    // The files, and the SHA-256 of all of them in order.
    let names: Vec<String> = (0..case.files).map(|i| format!("f{i:05}.bin")).collect();
    let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
    let mut payload = Payload::new(PayloadKind::Random, 18, 0);
    let mut file = vec![0; case.file_bytes];
    for name in &names {
        payload.fill(&mut file);
        std::fs::write(samba.share_dir().join(name), &file)?;
        digest.update(&file);
    }
    drop(file);
    let want = hex(digest.finish().as_ref());
    let report = match case.client {
        Client::Smbprotocol => smbprotocol(case, &lab, python, &work, server, &names, &[]),
        Client::SmbprotocolCompound => {
            smbprotocol(case, &lab, python, &work, server, &names, &["--compound"])
        }
        Client::SmbprotocolShareWrite => smbprotocol(
            case,
            &lab,
            python,
            &work,
            server,
            &names,
            &["--share-write"],
        ),
        Client::Smbclient => smbclient(case, &lab, &samba, &work, server, &names, false),
        Client::SmbclientPut => smbclient(case, &lab, &samba, &work, server, &names, true),
    };
    let usage = match gateways {
        Some(g) => {
            let near = g.status(&lab, Node::GwA)?["smb"].clone();
            let far = g.status(&lab, Node::GwB)?["smb"].clone();
            let engine = (near["answered_locally"].as_u64(), far["missed"].as_u64());
            Some((g.stop(&lab)?, verdict(&near), engine))
        }
        None => None,
    };
    drop(samba);
    drop(lab);
    let _ = std::fs::remove_dir_all(&work);
    let report = report?;
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
        client: case.client,
        files: report.files,
        file_bytes: case.file_bytes,
        read_bytes: case.read_bytes,
        setup_s: report.setup_s,
        read_s: report.read_s,
        reads: report.reads,
        mbit_s: report.bytes as f64 * 8.0 / report.read_s / 1e6,
        files_per_s: report.files as f64 / report.read_s,
        read_rtt: report.reads_s / reads / rtt_s,
        slowest_read_rtt: report.slowest_read_s / rtt_s,
        signing: report.signing,
        gateway_verdict: usage
            .as_ref()
            .filter(|_| case.gateways.smb)
            .map(|(_, v, _)| v.clone()),
        smb: usage.as_ref().map(|_| case.gateways.smb),
        smb_validity_ms: case.gateways.smb_validity_ms.filter(|_| case.gateways.smb),
        answered_locally: usage
            .as_ref()
            .filter(|_| case.gateways.smb)
            .and_then(|(_, _, (near, _))| *near),
        missed: usage
            .as_ref()
            .filter(|_| case.gateways.smb)
            .and_then(|(_, _, (_, far))| *far),
        cpu_s_gw_a: usage.as_ref().map(|([(a, _), _], _, _)| a.user_s + a.sys_s),
        cpu_s_gw_b: usage.as_ref().map(|([_, (b, _)], _, _)| b.user_s + b.sys_s),
        max_rss_kb_gw_a: usage.as_ref().map(|([(a, _), _], _, _)| a.max_rss_kb),
        max_rss_kb_gw_b: usage.as_ref().map(|([_, (b, _)], _, _)| b.max_rss_kb),
        verified: report.bytes == case.files * case.file_bytes && report.sha256 == want,
    })
}

/// Reads `names` with the one-READ client (smbprotocol), given `flags` (`smb_read.py`'s:
/// `--compound`, `--share-write`).
fn smbprotocol(
    case: &SmbCase,
    lab: &Lab,
    python: &Path,
    work: &Path,
    server: std::net::IpAddr,
    names: &[String],
    flags: &[&str],
) -> Result<ClientReport> {
    let script = work.join("smb_read.py");
    std::fs::write(&script, include_str!("smb_read.py"))?;
    let out = lab
        .command(Node::Client, python)
        .arg(&script)
        .args(flags)
        .args([
            &server.to_string(),
            "pub",
            &case.read_bytes.to_string(),
            &format!("{:#06x}", case.dialect),
            "root",
            Samba::PASSWORD,
        ])
        .args(names)
        .output()
        .context("running the SMB client")?;
    if !out.status.success() {
        bail!(
            "the SMB client failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "the client's report: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Reads the files in `names` with smbclient's `get`, one after another in one session
/// (a guest session, never signed), or with `put` writes a copy of the one file to the
/// share; what was read, or what landed in the share, is hashed. One file is timed as
/// smbclient reports the transfer itself; several by the whole session, less the time a
/// session that only connects takes (measured just before).
fn smbclient(
    case: &SmbCase,
    lab: &Lab,
    samba: &Samba,
    work: &Path,
    server: std::net::IpAddr,
    names: &[String],
    put: bool,
) -> Result<ClientReport> {
    if put && names.len() != 1 {
        bail!(
            "smbclient writes one file (--smb-file-mib), not {}",
            names.len()
        );
    }
    let protocol = match case.dialect {
        0x0202 => "SMB2_02",
        0x0210 => "SMB2_10",
        0x0300 => "SMB3_00",
        0x0302 => "SMB3_02",
        0x0311 => "SMB3_11",
        other => bail!("no smbclient protocol name for dialect {other:#06x}"),
    };
    let config = samba.client_config(protocol)?;
    let out_dir = work.join("smbclient-out");
    std::fs::create_dir_all(&out_dir)?;
    let local = |name: &str| out_dir.join(name);
    let uploaded = |name: &str| samba.share_dir().join(format!("up-{name}"));
    let command = if put {
        let name = &names[0];
        std::fs::copy(samba.share_dir().join(name), local(name))?;
        format!("put {} up-{name}", local(name).display())
    } else {
        let gets: Vec<String> = names
            .iter()
            .map(|name| format!("get {name} {}", local(name).display()))
            .collect();
        gets.join("; ")
    };
    let session = |command: &str| -> Result<(f64, String)> {
        let started = std::time::Instant::now();
        let out = Samba::smbclient(
            lab,
            Node::Client,
            &config,
            &[
                "//wsx-server/pub",
                "-I",
                &server.to_string(),
                "-p",
                "445",
                "-N",
                "-c",
                command,
            ],
        )
        .output()
        .context("running smbclient")?;
        let total_s = started.elapsed().as_secs_f64();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            bail!("smbclient failed: {}", text.trim());
        }
        Ok((total_s, text))
    };
    let connect_s = if names.len() > 1 {
        session("exit")?.0
    } else {
        0.0
    };
    let (total_s, text) = session(&command)?;
    let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
    let mut bytes = 0;
    for name in names {
        let data = std::fs::read(if put { uploaded(name) } else { local(name) })?;
        digest.update(&data);
        bytes += data.len();
    }
    let read_s = if names.len() > 1 {
        (total_s - connect_s).max(f64::MIN_POSITIVE)
    } else {
        // "getting file \\NAME of size N as PATH (R KiloBytes/sec) (average ...)", or
        // "putting file PATH as \\NAME (R kb/s) (average ...)".
        let rate = text
            .split("as ")
            .nth(1)
            .and_then(|t| t.split('(').nth(1))
            .and_then(|t| t.split(' ').next())
            .and_then(|r| r.parse::<f64>().ok())
            .with_context(|| format!("no rate in smbclient's output: {text}"))?;
        bytes as f64 / (rate * 1024.0)
    };
    Ok(ClientReport {
        bytes,
        sha256: hex(digest.finish().as_ref()),
        setup_s: if names.len() > 1 {
            connect_s
        } else {
            (total_s - read_s).max(0.0)
        },
        read_s,
        files: names.len(),
        reads: 0,
        reads_s: 0.0,
        slowest_read_s: 0.0,
        signing: false,
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
    /// What was read: one file or many, and by whom.
    fn workload(&self) -> String {
        let size = if self.file_bytes >= 1 << 20 {
            format!("{} MiB", self.file_bytes >> 20)
        } else {
            format!("{} KiB", self.file_bytes >> 10)
        };
        match self.client {
            Client::Smbclient if self.files == 1 => format!("{size}, smbclient"),
            Client::Smbclient => format!("{} × {size}, smbclient", self.files),
            Client::SmbclientPut => format!("{size} written, smbclient"),
            Client::Smbprotocol if self.files == 1 => {
                format!("{size}, {} KiB READs", self.read_bytes >> 10)
            }
            Client::Smbprotocol => format!("{} × {size}", self.files),
            Client::SmbprotocolCompound => {
                format!("{} × {size}, CREATE+QUERY_INFO compounds", self.files)
            }
            Client::SmbprotocolShareWrite if self.files == 1 => {
                format!(
                    "{size}, {} KiB READs, others may write",
                    self.read_bytes >> 10
                )
            }
            Client::SmbprotocolShareWrite => format!("{} × {size}, others may write", self.files),
        }
    }

    /// Round trips per file (CREATE, READs, CLOSE), for many files.
    fn rtt_per_file(&self) -> Option<f64> {
        (self.files > 1).then(|| self.read_s / self.files as f64 / (self.rtt_ms / 1e3))
    }

    /// The system measured: the mode, and for wsx whether SMB was on.
    fn system(&self) -> String {
        match (self.smb, self.smb_validity_ms) {
            (Some(false), _) => format!("{} (no SMB)", self.mode.label()),
            (_, Some(ms)) => format!("{} (validity {ms} ms)", self.mode.label()),
            _ => self.mode.label().to_owned(),
        }
    }

    fn summary(&self) -> String {
        let per_read = if self.reads > 0 {
            format!(
                ", {:.3} RTT per READ (slowest {:.2})",
                self.read_rtt, self.slowest_read_rtt
            )
        } else {
            String::new()
        };
        let per_file = self.rtt_per_file().map_or(String::new(), |rtt| {
            format!(", {:.1} files/s ({rtt:.2} RTT each)", self.files_per_s)
        });
        format!(
            "{}: {} ms {} % {} Mbit/s, {} ({}): {:.2} Mbit/s{per_file}{per_read}, setup {:.2} s{}{}{}",
            self.system(),
            self.rtt_ms,
            self.loss_pct,
            self.rate_mbit,
            self.workload(),
            self.dialect,
            self.mbit_s,
            self.setup_s,
            self.gateway_verdict
                .as_ref()
                .map_or(String::new(), |v| format!(", gateways: {v}")),
            self.answered_locally.map_or(String::new(), |n| format!(
                ", {n} requests answered at gw-a, {} missed",
                self.missed.unwrap_or(0)
            )),
            if self.verified { "" } else { " NOT VERIFIED" },
        )
    }
}

fn markdown_table(records: &[SmbRecord]) -> String {
    let mut out = String::from(
        "| system | RTT ms | loss % | Mbit/s | dialect | read | read s | Mbit/s | files/s | RTT per file | RTT per READ | slowest READ RTT | gw-a CPU s | gw-b CPU s | verified |\n\
         |---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    let cpu = |s: Option<f64>| s.map_or("–".into(), |s| format!("{s:.2}"));
    let per_read = |r: &SmbRecord, v: f64| {
        if r.reads > 0 {
            format!("{v:.3}")
        } else {
            "–".into()
        }
    };
    for r in records {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {:.1} | {:.2} | {:.1} | {} | {} | {} | {} | {} | {} |",
            r.system(),
            r.rtt_ms,
            r.loss_pct,
            r.rate_mbit,
            r.dialect,
            r.workload(),
            r.read_s,
            r.mbit_s,
            r.files_per_s,
            r.rtt_per_file().map_or("–".into(), |v| format!("{v:.2}")),
            per_read(r, r.read_rtt),
            per_read(r, r.slowest_read_rtt),
            cpu(r.cpu_s_gw_a),
            cpu(r.cpu_s_gw_b),
            if r.verified { "yes" } else { "NO" },
        );
    }
    out
}
