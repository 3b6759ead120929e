//! `cargo xtask bench --exchanges N`: request/response with one request outstanding, as a
//! file client that keeps one READ in flight. The client in the client namespace asks the
//! server in the server namespace for N answers of `--answer-kib` one after another; each
//! exchange is timed from the request's write to the answer's last byte and every answer is
//! checked byte for byte. The answers travel server → client, so gw-b is the tunnel's sender.
//!
//! The figure to read is the exchange time in round trips: the least any system can do is
//! one round trip plus the answer's time at the bottleneck rate (`ideal_ms`).

use crate::bench::{Mode, append_json_line, read_json, tempdir};
use crate::gateway::{Fec, Pair, Settings};
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Stdio;
use wsx_lab::traffic::ExchangeReport;
use wsx_lab::{Lab, Node, WanSpec, addr};

/// One case.
#[derive(Clone, Debug)]
pub(crate) struct ExchangeCase {
    pub(crate) mode: Mode,
    pub(crate) wan: WanSpec,
    pub(crate) ipv6: bool,
    pub(crate) exchanges: usize,
    pub(crate) answer_bytes: usize,
    /// The gateways' settings in the wsx modes.
    pub(crate) gateways: Settings,
    /// The gateways' binary, if not the one just built.
    pub(crate) wsx_binary: Option<std::path::PathBuf>,
}

/// Its record (a JSON line).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ExchangeRecord {
    pub(crate) mode: Mode,
    /// The congestion control set on the client's and the server's sockets, if any.
    pub(crate) cc: Option<String>,
    /// The gateways' FEC and stated rate, in the wsx modes.
    pub(crate) fec: Option<Fec>,
    pub(crate) max_rate_mbit: Option<f64>,
    /// The gateways' binary, if not the one just built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) wsx_binary: Option<std::path::PathBuf>,
    pub(crate) ip: &'static str,
    pub(crate) rtt_ms: f64,
    pub(crate) loss_pct: f64,
    pub(crate) rate_mbit: f64,
    pub(crate) exchanges: usize,
    pub(crate) answer_bytes: usize,
    /// One round trip plus the answer's IP bytes at the bottleneck rate.
    pub(crate) ideal_ms: f64,
    pub(crate) connect_ms: f64,
    /// The first exchange (on a fresh connection), then quantiles over all of them.
    pub(crate) first_ms: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p90_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
    pub(crate) mean_ms: f64,
    /// The median and the 99th percentile in round trips.
    pub(crate) p50_rtt: f64,
    pub(crate) p99_rtt: f64,
    /// Packets the emulated link dropped, both directions.
    pub(crate) emu_drops: u64,
    /// CPU seconds of the gateways (wsx modes) and of the emulator.
    pub(crate) cpu_s_gw_a: Option<f64>,
    pub(crate) cpu_s_gw_b: Option<f64>,
    pub(crate) cpu_s_emulator: f64,
    /// The answering gateway (gw-b): tunnel packets it sent with data, declared lost, and
    /// rebuilt by gw-a from parity; parity packets it sent.
    pub(crate) gw_b_packets: Option<[u64; 4]>,
    /// Every exchange completed and every answer matched.
    pub(crate) verified: bool,
}

/// Runs every case and prints and records the results.
pub(crate) fn run(cases: &[ExchangeCase], binary: &Path, json: Option<&Path>) -> Result<()> {
    let out_dir = crate::workspace_root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let mut records = Vec::new();
    for case in cases {
        let record = run_case(case, binary).with_context(|| case.describe())?;
        println!("{}", record.summary());
        if let Some(path) = json {
            append_json_line(path, &serde_json::to_string(&record)?)?;
        }
        records.push(record);
        std::fs::write(out_dir.join("exchanges.md"), markdown_table(&records))?;
    }
    println!("{}", markdown_table(&records));
    if let Some(bad) = records.iter().find(|r| !r.verified) {
        bail!("exchanges not verified: {}", bad.summary());
    }
    Ok(())
}

impl ExchangeCase {
    fn describe(&self) -> String {
        format!(
            "{} {} ms {} % {} Mbit/s, {} exchanges of {} B{}",
            self.mode.label(),
            self.wan.rtt_ms,
            self.wan.loss_pct,
            self.wan.rate_mbit,
            self.exchanges,
            self.answer_bytes,
            if self.mode.is_wsx() {
                format!(" fec {}", self.gateways.fec.as_str())
            } else {
                String::new()
            }
        )
    }
}

fn run_case(case: &ExchangeCase, binary: &Path) -> Result<ExchangeRecord> {
    let lab = Lab::start(&case.wan.emulator_config())?;
    let work = tempdir(&lab)?;
    let server = std::net::SocketAddr::new(addr::server(case.ipv6), 5201);
    let entry = case.mode.entry(case.ipv6, server);
    let gateways = match case.mode {
        Mode::Wsx | Mode::WsxForward => Some(Pair::start_binary(
            &lab,
            &work,
            binary,
            case.wsx_binary.as_deref(),
            case.gateways,
            (entry != server).then_some((entry, server)),
        )?),
        Mode::DirectCubic | Mode::DirectBbr => None,
        other => bail!("--exchanges runs over TCP: {} has no TCP", other.label()),
    };
    let cc = case.mode.congestion();
    let mut answering = lab.command(Node::Server, binary);
    answering.args(["answer", "--listen", &server.to_string()]);
    if let Some(cc) = cc {
        answering.args(["--cc", cc]);
    }
    let mut answering = crate::shaping::spawn_ready(answering, "answering server")?;
    let report_path = work.join("exchange.json");
    let before = lab.emulator().stats()?;
    let mut client = lab.command(Node::Client, binary);
    client.args([
        "exchange",
        "--to",
        &entry.to_string(),
        "--exchanges",
        &case.exchanges.to_string(),
        "--answer-bytes",
        &case.answer_bytes.to_string(),
    ]);
    if let Some(cc) = cc {
        client.args(["--cc", cc]);
    }
    let client_status = client
        .arg("--json")
        .arg(&report_path)
        .stdout(Stdio::null())
        .status()?;
    let server_status = answering.wait()?;
    let after = lab.emulator().stats()?;
    let usage = gateways.map(|g| g.stop(&lab)).transpose()?;
    drop(lab);
    let report: ExchangeReport = read_json(&report_path).context("the client's report")?;
    let _ = std::fs::remove_dir_all(&work);
    if let Some(error) = &report.error {
        eprintln!("exchanges failed: {error}");
    }

    let fwd = after.a_to_b.since(&before.a_to_b);
    let rev = after.b_to_a.since(&before.b_to_a);
    let ms = |ns: u64| ns as f64 / 1e6;
    let mut sorted = report.exchanges_ns.clone();
    sorted.sort_unstable();
    let quantile = |q: f64| {
        if sorted.is_empty() {
            return 0.0;
        }
        let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
        ms(sorted[i])
    };
    let mean_ms = if sorted.is_empty() {
        0.0
    } else {
        sorted.iter().map(|&ns| ms(ns)).sum::<f64>() / sorted.len() as f64
    };
    // The answer in full-size TCP segments of 1448 bytes (IPv4, timestamps), 1514-byte
    // frames' worth of IP bytes each.
    let ip_bytes = case.answer_bytes.div_ceil(1448) as f64 * 1500.0;
    let ideal_ms = case.wan.rtt_ms
        + if case.wan.rate_mbit > 0.0 {
            ip_bytes * 8.0 / (case.wan.rate_mbit * 1e3)
        } else {
            0.0
        };
    let (p50_ms, p99_ms) = (quantile(0.5), quantile(0.99));
    Ok(ExchangeRecord {
        mode: case.mode,
        cc: cc.map(String::from),
        fec: case.mode.is_wsx().then_some(case.gateways.fec),
        max_rate_mbit: case.gateways.max_rate_mbit.filter(|_| case.mode.is_wsx()),
        wsx_binary: case.wsx_binary.clone(),
        ip: if case.ipv6 { "ipv6" } else { "ipv4" },
        rtt_ms: case.wan.rtt_ms,
        loss_pct: case.wan.loss_pct,
        rate_mbit: case.wan.rate_mbit,
        exchanges: case.exchanges,
        answer_bytes: case.answer_bytes,
        ideal_ms,
        connect_ms: ms(report.connect_ns),
        first_ms: report.exchanges_ns.first().map_or(0.0, |&ns| ms(ns)),
        p50_ms,
        p90_ms: quantile(0.9),
        p99_ms,
        max_ms: sorted.last().map_or(0.0, |&ns| ms(ns)),
        mean_ms,
        p50_rtt: p50_ms / case.wan.rtt_ms,
        p99_rtt: p99_ms / case.wan.rtt_ms,
        emu_drops: fwd.emulated_drops() + rev.emulated_drops(),
        cpu_s_gw_a: usage.as_ref().map(|[(a, _), _]| a.user_s + a.sys_s),
        cpu_s_gw_b: usage.as_ref().map(|[_, (b, _)]| b.user_s + b.sys_s),
        cpu_s_emulator: after.cpu_s() - before.cpu_s(),
        gw_b_packets: usage.as_ref().map(|[_, (_, b)]| {
            [
                b.data_packets_sent,
                b.packets_lost,
                b.fec_recovered_by_peer,
                b.fec_parity_sent,
            ]
        }),
        verified: report.verified && client_status.success() && server_status.success(),
    })
}

impl ExchangeRecord {
    fn label(&self) -> String {
        match (self.fec, self.max_rate_mbit) {
            (Some(fec), Some(rate)) => {
                format!("{} fec {} max {rate}", self.mode.label(), fec.as_str())
            }
            (Some(fec), None) => format!("{} fec {}", self.mode.label(), fec.as_str()),
            _ => self.mode.label().to_string(),
        }
    }

    fn summary(&self) -> String {
        format!(
            "{}: {} ms {} % {} Mbit/s, {} × {} B: p50 {:.1} ms ({:.3} RTT), p99 {:.1} ms ({:.3} RTT), first {:.1} ms, mean {:.1} ms (ideal {:.1}){}",
            self.label(),
            self.rtt_ms,
            self.loss_pct,
            self.rate_mbit,
            self.exchanges,
            self.answer_bytes,
            self.p50_ms,
            self.p50_rtt,
            self.p99_ms,
            self.p99_rtt,
            self.first_ms,
            self.mean_ms,
            self.ideal_ms,
            if self.verified { "" } else { " NOT VERIFIED" },
        ) + &self
            .wsx_binary
            .as_ref()
            .map_or(String::new(), |b| format!(", binary {}", b.display()))
    }
}

fn markdown_table(records: &[ExchangeRecord]) -> String {
    let mut out = String::from(
        "| system | RTT ms | loss % | Mbit/s | exchanges | answer B | ideal ms | first ms | p50 ms | p90 ms | p99 ms | max ms | p50 RTT | p99 RTT | gw-a CPU s | gw-b CPU s | verified |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    let cpu = |s: Option<f64>| s.map_or("–".into(), |s| format!("{s:.2}"));
    for r in records {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.3} | {:.3} | {} | {} | {} |",
            r.label(),
            r.rtt_ms,
            r.loss_pct,
            r.rate_mbit,
            r.exchanges,
            r.answer_bytes,
            r.ideal_ms,
            r.first_ms,
            r.p50_ms,
            r.p90_ms,
            r.p99_ms,
            r.max_ms,
            r.p50_rtt,
            r.p99_rtt,
            cpu(r.cpu_s_gw_a),
            cpu(r.cpu_s_gw_b),
            if r.verified { "yes" } else { "NO" },
        );
    }
    out
}
