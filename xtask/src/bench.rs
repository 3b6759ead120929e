//! `cargo xtask bench`: benchmark cases on the lab.
//!
//! A case builds a fresh lab with the requested WAN, runs the verified sink in the server
//! namespace and the sender in the client namespace (client → server is the data direction,
//! a_to_b at the emulator), and records goodput, ramp-up, fairness, packet counts in each
//! direction, emulator drops and CPU time per process group.

use crate::chart::{Series, line_chart};
use crate::gateway::{Fec, Settings, Totals};
use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use wsx_lab::emulator::EmulatorStats;
use wsx_lab::traffic::{BUCKET_NS, PayloadKind, SendReport, SinkReport, TunnelReport};
use wsx_lab::{Lab, LossDirection, Node, WanSpec, addr};
use wsx_tunnel::SecretKey;

/// The UDP port of the tunnel in the tunnel modes.
const TUNNEL_PORT: u16 = 4500;

/// What carries the traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Mode {
    /// Plain kernel TCP, CUBIC, end to end through the emulated WAN.
    DirectCubic,
    /// Plain kernel TCP, BBR, end to end through the emulated WAN.
    DirectBbr,
    /// Through the wsx gateways on gw-a and gw-b, intercepted transparently.
    Wsx,
    /// Through the wsx gateways, entering by a forwarding listener on gw-a (no
    /// interception): the sender connects to gw-a, gw-b connects to the server.
    WsxForward,
    /// The tunnel alone: streams from memory in gw-a to memory in gw-b, carried by the
    /// tunnel driver across the emulated WAN (no TCP, no proxy).
    Tunnel,
    /// The tunnel alone over a clean veth (client → gw-a, no emulator, offloads on): the
    /// tunnel's raw throughput and CPU cost.
    TunnelVeth,
    /// Through both gateways as in wsx-forward, over a clean WAN (a kernel bridge instead
    /// of the emulator, offloads on): kernel TCP in, the tunnel, kernel TCP out, at the
    /// fastest the gateways go, and their CPU seconds per GB.
    WsxVeth,
    /// Plain kernel TCP, CUBIC, shaped by the kernel's HTB on gw-a's WAN interface at
    /// --shape-mbit (one class, burst of 1 ms at the rate, a pfifo leaf): the reference
    /// for wsx's shaper.
    HtbCubic,
}

impl Mode {
    pub(crate) fn congestion(self) -> Option<&'static str> {
        match self {
            Mode::DirectCubic | Mode::HtbCubic => Some("cubic"),
            Mode::DirectBbr => Some("bbr"),
            Mode::Wsx | Mode::WsxForward | Mode::WsxVeth | Mode::Tunnel | Mode::TunnelVeth => None,
        }
    }

    fn is_tunnel(self) -> bool {
        matches!(self, Mode::Tunnel | Mode::TunnelVeth)
    }

    /// Runs on a clean veth, without a bottleneck or emulator.
    pub(crate) fn is_veth(self) -> bool {
        matches!(self, Mode::TunnelVeth | Mode::WsxVeth)
    }

    /// Where the sink and the sender run, and where the sender sends.
    fn endpoints(self, ipv6: bool) -> (Node, Node, SocketAddr) {
        let pick = |v4: std::net::Ipv4Addr, v6: std::net::Ipv6Addr| -> IpAddr {
            if ipv6 { v6.into() } else { v4.into() }
        };
        match self {
            Mode::Tunnel => (
                Node::GwB,
                Node::GwA,
                SocketAddr::new(pick(addr::GWB_WAN_V4, addr::GWB_WAN_V6), TUNNEL_PORT),
            ),
            Mode::TunnelVeth => (
                Node::GwA,
                Node::Client,
                SocketAddr::new(pick(addr::GWA_LAN_V4, addr::GWA_LAN_V6), TUNNEL_PORT),
            ),
            Mode::DirectCubic
            | Mode::DirectBbr
            | Mode::HtbCubic
            | Mode::Wsx
            | Mode::WsxForward
            | Mode::WsxVeth => (
                Node::Server,
                Node::Client,
                SocketAddr::new(addr::server(ipv6), 5201),
            ),
        }
    }

    pub(crate) fn is_wsx(self) -> bool {
        matches!(self, Mode::Wsx | Mode::WsxForward | Mode::WsxVeth)
    }

    /// Where the sender connects: the sink's address, or the forwarding listener on gw-a
    /// (same port) that leads there.
    pub(crate) fn entry(self, ipv6: bool, sink: SocketAddr) -> SocketAddr {
        match self {
            Mode::WsxForward | Mode::WsxVeth => {
                let lan: IpAddr = if ipv6 {
                    addr::GWA_LAN_V6.into()
                } else {
                    addr::GWA_LAN_V4.into()
                };
                SocketAddr::new(lan, sink.port())
            }
            _ => sink,
        }
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            Mode::DirectCubic => "direct-cubic",
            Mode::DirectBbr => "direct-bbr",
            Mode::Wsx => "wsx",
            Mode::WsxForward => "wsx-forward",
            Mode::Tunnel => "tunnel",
            Mode::TunnelVeth => "tunnel-veth",
            Mode::WsxVeth => "wsx-veth",
            Mode::HtbCubic => "htb-cubic",
        }
    }
}

/// Predefined matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Matrix {
    /// RTT 10/50/100/200/400 ms × loss 0/0.1/1/5 % × 1 and 10 flows, at --rate-mbit.
    Default,
    /// The two plots of goodput: against loss (0, 0.5, 1, 2, 5 and 10 % at 100 ms RTT) and
    /// against RTT (10, 50, 100, 200, 400 and 600 ms without loss), at --rate-mbit, one flow
    /// [default modes: direct-cubic, direct-bbr and wsx].
    Plots,
    /// The wsx gateways with FEC off/adaptive × compression off/on, at 100 ms RTT and
    /// --rate-mbit, over loss 0/1/5 % and burst loss (about 1 %, bursts of 3 on average),
    /// with random and text payloads.
    Fec,
}

#[derive(clap::Args, Debug)]
pub(crate) struct BenchArgs {
    /// What carries the traffic; repeat to compare [default: direct-cubic, and for a matrix
    /// direct-cubic and direct-bbr].
    #[arg(long, value_enum)]
    mode: Vec<Mode>,
    /// The emulated WAN of a single case (ignored by --matrix except --rate-mbit, --loss-dir,
    /// --jitter-ms and --seed).
    #[command(flatten)]
    wan: WanSpec,
    /// Parallel TCP connections.
    #[arg(long, default_value_t = 1)]
    flows: u16,
    /// Seconds of sending per case.
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    /// Seconds of one transfer through the same gateways before the measured one, then a
    /// second with nothing to send: a tunnel in use recently, not a cold one (0: cold).
    #[arg(long, default_value_t = 0.0)]
    warm_up_seconds: f64,
    /// Payload of the transfers.
    #[arg(long, value_enum, default_value_t = PayloadKind::Random)]
    payload: PayloadKind,
    /// Run over IPv6 instead of IPv4.
    #[arg(long)]
    ipv6: bool,
    /// The gateways' forward error correction (wsx modes); repeat to compare [default:
    /// adaptive].
    #[arg(long, value_enum)]
    fec: Vec<Fec>,
    /// Turn the gateways' compression off (wsx mode).
    #[arg(long)]
    no_compression: bool,
    /// Run a predefined matrix instead of a single case.
    #[arg(long, value_enum)]
    matrix: Option<Matrix>,
    /// Also append the records (JSON Lines, one per case) to this file, so that several
    /// runs can collect into one.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Shape the sessions to this rate: wsx's shaper on gw-a (wsx modes) or the kernel's
    /// HTB on gw-a's WAN interface (htb-cubic); the record then has the shaping error.
    #[arg(long)]
    shape_mbit: Option<f64>,
    /// The gateways' `max_rate_mbit` (wsx modes): the tunnel starts at this rate and never
    /// sends faster.
    #[arg(long)]
    max_rate_mbit: Option<f64>,
    /// The gateways' `max_datagram` (wsx modes), the cap on path MTU discovery; repeat to
    /// compare several in one run [default: the gateways' default].
    #[arg(long)]
    max_datagram: Vec<u16>,
    /// The veth modes (tunnel-veth, wsx-veth): the veth's MTU (9000: jumbo frames); repeat
    /// to compare [default: 1500].
    #[arg(long)]
    veth_mtu: Vec<u16>,
    /// The gateways' `wsx` binary (wsx modes), for comparing builds in one run: repeat to
    /// alternate between them case by case [default: the one built beside the lab binary].
    #[arg(long)]
    wsx_binary: Vec<PathBuf>,
    /// Instead of bulk transfers, open this many concurrent sessions and hold them (a
    /// number, or "max": as many as the gateways carry); repeat for several counts. Modes:
    /// wsx (intercepting gateways) and direct-cubic (no gateways) [default: both].
    #[arg(long)]
    sessions: Vec<crate::sessions::Count>,
    /// Sessions being opened at once, over all session clients.
    #[arg(long, default_value_t = 128)]
    concurrency: usize,
    /// --sessions speak SMB2 to simulated servers on port 445 (each reads a 128 KiB file
    /// to open and another after the hold) instead of echoing a request.
    #[arg(long)]
    sessions_smb: bool,
    /// Instead of bulk transfers, this many request/response exchanges one after another,
    /// one request outstanding (a file client keeping one READ in flight); modes: wsx,
    /// wsx-forward, direct-cubic, direct-bbr [default: direct-bbr and wsx].
    #[arg(long)]
    exchanges: Option<usize>,
    /// Bytes of each answer in --exchanges, KiB.
    #[arg(long, default_value_t = 64)]
    answer_kib: usize,
    /// Instead of bulk transfers, an SMB file read of this many MiB from Samba in the
    /// server's namespace, one READ outstanding (smbprotocol) unless --smb-client says
    /// otherwise; modes: wsx, direct-cubic, direct-bbr [default: direct-bbr and wsx].
    #[arg(long)]
    smb_file_mib: Option<usize>,
    /// Instead of bulk transfers, this many SMB files of --smb-file-kib read one after
    /// another in one session (CREATE, READs, CLOSE) by the one-READ client, or by
    /// smbclient's `get` with `--smb-client smbclient`: files per second.
    #[arg(long)]
    smb_files: Option<usize>,
    /// The size of each file in --smb-files, KiB.
    #[arg(long, default_value_t = 64)]
    smb_file_kib: usize,
    /// The client of --smb-file-mib and --smb-files.
    #[arg(long, value_enum, default_value = "smbprotocol")]
    smb_client: crate::smb::Client,
    /// The size of each READ of the one-READ client, KiB.
    #[arg(long, default_value_t = 64)]
    smb_read_kib: usize,
    /// The gateways' `smb_read_ahead_mib` in the SMB cases (their default if not given).
    #[arg(long)]
    smb_read_ahead_mib: Option<u32>,
    /// The gateways' `smb_validity_ms` in the SMB cases with SMB on (their default if not
    /// given); repeat to run each.
    #[arg(long)]
    smb_validity_ms: Vec<u32>,
    /// In the SMB cases, run wsx only with SMB on (by default it runs without, `smb =
    /// false`, and with, each a case).
    #[arg(long)]
    smb_only: bool,
    /// The SMB dialect the client asks for in --smb-file-mib and --smb-files (hexadecimal,
    /// e.g. 0x0210 for 2.1, 0x0311 for 3.1.1).
    #[arg(long, default_value = "0x0210", value_parser = parse_dialect)]
    smb_dialect: u16,
    /// Instead, the tunnel core alone in simulation with this many concurrent streams
    /// (heap per stream, CPU per stream opened and closed); repeat for several counts.
    #[arg(long)]
    streams: Vec<usize>,
}

/// One benchmark case.
#[derive(Clone, Debug)]
pub(crate) struct Case {
    pub(crate) mode: Mode,
    pub(crate) wan: WanSpec,
    pub(crate) flows: u16,
    pub(crate) seconds: f64,
    /// See `--warm-up-seconds`.
    pub(crate) warm_up_s: f64,
    pub(crate) payload: PayloadKind,
    pub(crate) ipv6: bool,
    /// The gateways' settings in the wsx mode.
    pub(crate) gateways: Settings,
    /// The tunnel-veth mode: the MTU of the veth between the endpoints (1500 if `None`).
    pub(crate) veth_mtu: Option<u16>,
    /// The gateways' binary, if not the one just built.
    pub(crate) wsx_binary: Option<PathBuf>,
}

/// The result of one case: one JSON record.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) mode: Mode,
    /// The congestion control the kernel reported for the sender's sockets.
    pub(crate) cc: Option<String>,
    pub(crate) ip: &'static str,
    /// The tunnel-veth mode's veth MTU, if not 1500.
    #[serde(default)]
    pub(crate) veth_mtu: Option<u16>,
    /// The gateways' binary, if not the one just built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) wsx_binary: Option<PathBuf>,
    pub(crate) rtt_ms: f64,
    pub(crate) loss_pct: f64,
    pub(crate) loss_dir: LossDirection,
    /// Gilbert-Elliott burst loss (percent chances of entering and leaving the lossy state).
    pub(crate) burst_p_pct: Option<f64>,
    pub(crate) burst_r_pct: Option<f64>,
    pub(crate) rate_mbit: f64,
    pub(crate) queue_ms: f64,
    pub(crate) flows: u16,
    pub(crate) seconds: f64,
    /// A transfer of this many seconds ran through the same gateways first (0: none).
    #[serde(default)]
    pub(crate) warm_up_s: f64,
    pub(crate) payload: PayloadKind,
    /// Payload bytes delivered and verified.
    pub(crate) bytes: u64,
    /// From the sender's start to the last byte at the sink.
    pub(crate) duration_s: f64,
    pub(crate) goodput_mbit: f64,
    /// Goodput over the bottleneck rate (which counts IP bytes, headers included).
    pub(crate) utilization: f64,
    /// The same from [`STEADY_FROM_MS`] after the start to the last full bucket: the rate a
    /// flow holds once the start-up is over, comparable with the tunnel's simulation tests.
    #[serde(default)]
    pub(crate) steady_utilization: f64,
    /// First 100 ms bucket in which the flows together reached 90 % of the rate, at its end.
    pub(crate) t90_ms: Option<u64>,
    pub(crate) ttfb_ms: f64,
    /// Jain's fairness index over the flows' byte counts (1.0: equal).
    pub(crate) jain: f64,
    /// Packets the emulator forwarded in the data direction (client → server).
    pub(crate) fwd_pkts: u64,
    /// Packets the emulator forwarded in the reverse direction (server → client).
    pub(crate) rev_pkts: u64,
    /// Reverse packets per forward packet.
    pub(crate) rev_per_fwd: f64,
    /// Packets the emulated link dropped, both directions (random + burst + queue).
    pub(crate) emu_drops: u64,
    pub(crate) emu_drops_fwd: DropBreakdown,
    /// Median and 95th percentile of the time packets in the data direction waited in the
    /// bottleneck queue, ms (upper edges of the emulator's half-octave buckets).
    #[serde(default)]
    pub(crate) queue_p50_ms: Option<f64>,
    #[serde(default)]
    pub(crate) queue_p95_ms: Option<f64>,
    /// Packets the emulator itself failed to carry; non-zero invalidates the case.
    pub(crate) emu_faults: u64,
    pub(crate) cpu_s: CpuSeconds,
    pub(crate) max_rss_kb: GatewayRss,
    /// Every byte arrived intact and both ends agree on the counts.
    pub(crate) verified: bool,
    /// Aggregate goodput per 100 ms, Mbit/s.
    pub(crate) series_mbit: Vec<f64>,
    /// The tunnel's own figures, in the tunnel modes.
    #[serde(default)]
    pub(crate) tunnel: Option<TunnelFigures>,
    /// The gateways' settings and what they report, in the wsx mode.
    #[serde(default)]
    pub(crate) gateways: Option<GatewayFigures>,
    /// The shaping error, in cases run with --shape-mbit.
    #[serde(default)]
    pub(crate) shaping: Option<ShapingFigures>,
}

/// The wsx mode's gateway figures, from what each gateway's API reports just before it
/// stops (data flows from gw-a to gw-b).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct GatewayFigures {
    pub(crate) fec: Fec,
    pub(crate) compression: bool,
    /// The gateways' `max_rate_mbit`, if set.
    #[serde(default)]
    pub(crate) max_rate_mbit: Option<f64>,
    /// The gateways' `max_datagram`, if set, and the datagram size gw-a's tunnel used at
    /// the end (path MTU discovery).
    #[serde(default)]
    pub(crate) max_datagram: Option<u16>,
    #[serde(default)]
    pub(crate) datagram_bytes: u64,
    /// The cipher gw-a's tunnel sealed its packets with.
    #[serde(default)]
    pub(crate) cipher: Option<String>,
    /// Tunnel packets gw-a sent with data, and those declared lost and sent again.
    pub(crate) packets_sent: u64,
    pub(crate) retransmitted: u64,
    /// Losses gw-b rebuilt from parity: retransmissions avoided.
    pub(crate) recovered: u64,
    pub(crate) unrecoverable_groups: u64,
    /// Parity packets per data packet.
    pub(crate) fec_overhead: f64,
    /// The path's loss each gateway read (gw-a's sending direction, then gw-b's, which
    /// mostly acknowledges), percent of the packets tracked for loss: to set beside the
    /// emulator's own drops.
    #[serde(default)]
    pub(crate) loss_read_pct: [f64; 2],
    /// What gw-b, in the direction that mostly acknowledges, sent: data packets, ACK-only
    /// packets and parity.
    #[serde(default)]
    pub(crate) reverse_packets: ReversePackets,
    /// Stream bytes per session byte gw-a sent (below 1: compression gained).
    pub(crate) wire_per_plain: f64,
    /// CPU seconds per GB of verified payload, each gateway.
    pub(crate) cpu_s_per_gb: [f64; 2],
}

/// See [`GatewayFigures::reverse_packets`].
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct ReversePackets {
    pub(crate) data: u64,
    pub(crate) ack_only: u64,
    pub(crate) parity: u64,
}

impl GatewayFigures {
    fn new(settings: Settings, [a, b]: [&Totals; 2], cpu_s: [f64; 2], bytes: u64) -> Self {
        let per = |x: u64, y: u64| if y == 0 { 0.0 } else { x as f64 / y as f64 };
        let gb = bytes as f64 / 1e9;
        let per_gb = |s: f64| if gb > 0.0 { s / gb } else { 0.0 };
        Self {
            fec: settings.fec,
            compression: settings.compression,
            max_rate_mbit: settings.max_rate_mbit,
            max_datagram: settings.max_datagram,
            datagram_bytes: a.datagram_bytes,
            cipher: a.cipher.clone(),
            packets_sent: a.data_packets_sent,
            retransmitted: a.packets_lost,
            recovered: a.fec_recovered_by_peer,
            unrecoverable_groups: a.fec_unrecoverable_groups,
            fec_overhead: per(a.fec_parity_sent, a.data_packets_sent),
            loss_read_pct: [a, b].map(|t| {
                100.0
                    * per(
                        t.packets_lost + t.fec_recovered_by_peer,
                        t.data_packets_sent + t.ack_only_packets_sent,
                    )
            }),
            reverse_packets: ReversePackets {
                data: b.data_packets_sent,
                ack_only: b.ack_only_packets_sent,
                parity: b.fec_parity_sent,
            },
            wire_per_plain: per(a.wire_sent, a.plain_sent),
            cpu_s_per_gb: cpu_s.map(per_gb),
        }
    }
}

/// What the tunnel drivers report about a tunnel-mode case.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct TunnelFigures {
    /// CPU seconds of the sending and the receiving driver thread per GB of payload.
    pub(crate) send_cpu_s_per_gb: f64,
    pub(crate) recv_cpu_s_per_gb: f64,
    /// Datagrams per `sendmsg` at the sender (GSO) and per receive call at the receiver
    /// (`recvmmsg`, GRO).
    pub(crate) datagrams_per_send: f64,
    pub(crate) datagrams_per_receive: f64,
    /// Data packets the sender sent, ACK-only packets the receiver sent, and their ratio.
    pub(crate) data_packets: u64,
    pub(crate) ack_packets: u64,
    pub(crate) acks_per_data: f64,
    pub(crate) packets_lost: u64,
    pub(crate) min_rtt_ms: f64,
    /// The sender's smoothed RTT and its controller's bottleneck estimate (UDP payload) and
    /// congestion reactions, at the end.
    #[serde(default)]
    pub(crate) smoothed_rtt_ms: f64,
    #[serde(default)]
    pub(crate) bottleneck_mbit: f64,
    #[serde(default)]
    pub(crate) congestion_events: u64,
    /// The datagram size the sender's tunnel used at the end (path MTU discovery), and
    /// its fall-backs to 1200 bytes (black holes).
    #[serde(default)]
    pub(crate) datagram_bytes: u64,
    #[serde(default)]
    pub(crate) mtu_black_holes: u64,
}

impl TunnelFigures {
    fn new(sent: &TunnelReport, received: &TunnelReport, bytes: u64) -> Self {
        let gb = bytes as f64 / 1e9;
        let per = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        Self {
            send_cpu_s_per_gb: (sent.driver_user_s + sent.driver_sys_s) / gb,
            recv_cpu_s_per_gb: (received.driver_user_s + received.driver_sys_s) / gb,
            datagrams_per_send: per(sent.datagrams_sent, sent.send_calls),
            datagrams_per_receive: per(received.datagrams_received, received.receive_calls),
            data_packets: sent.eliciting_sent,
            ack_packets: received.ack_only_sent,
            acks_per_data: per(received.ack_only_sent, sent.eliciting_sent),
            packets_lost: sent.packets_lost,
            min_rtt_ms: sent.min_rtt_ms,
            smoothed_rtt_ms: sent.smoothed_rtt_ms,
            bottleneck_mbit: sent.bottleneck_mbit,
            congestion_events: sent.congestion_events,
            datagram_bytes: sent.datagram_bytes,
            mtu_black_holes: sent.mtu_black_holes,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct DropBreakdown {
    pub(crate) random: u64,
    pub(crate) burst: u64,
    pub(crate) queue: u64,
}

/// CPU seconds per process group; gateways are `None` when no gateway process runs (direct
/// modes, where gw-a and gw-b only forward in the kernel). In the tunnel modes the gateways
/// are the sending (`gw_a`) and receiving (`gw_b`) driver threads, and `endpoints` the rest
/// of those processes (making and checking the payload).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct CpuSeconds {
    pub(crate) emulator: f64,
    pub(crate) gw_a: Option<f64>,
    pub(crate) gw_b: Option<f64>,
    pub(crate) endpoints: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct GatewayRss {
    pub(crate) gw_a: Option<u64>,
    pub(crate) gw_b: Option<u64>,
}

pub(crate) fn run(args: &BenchArgs) -> Result<()> {
    if !args.sessions.is_empty() {
        return run_sessions(args);
    }
    if !args.streams.is_empty() {
        return crate::sessions::run_streams(&args.streams, args.json.as_deref());
    }
    if let Some(exchanges) = args.exchanges {
        return run_exchanges(args, exchanges);
    }
    if let Some(mib) = args.smb_file_mib {
        return run_smb(args, args.smb_client, 1, mib << 20);
    }
    if let Some(files) = args.smb_files {
        return run_smb(args, args.smb_client, files, args.smb_file_kib << 10);
    }
    let cases = cases(args);
    let binary = crate::build_lab_binary()?;
    wsx_lab::install_signal_cleanup()?;
    let out_dir = crate::workspace_root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;

    let bar = ProgressBar::new(cases.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(500));
    let mut records = Vec::new();
    for case in &cases {
        bar.set_message(case.describe());
        let record =
            run_case(case, &binary).with_context(|| format!("case {}", case.describe()))?;
        if bar.is_hidden() {
            // No terminal (a log, CI): indicatif would swallow the line.
            println!("{}", record.summary());
        } else {
            bar.println(record.summary());
        }
        records.push(record);
        bar.inc(1);
        write_outputs(&records, &out_dir, args.json.as_deref())?;
    }
    bar.finish_and_clear();
    println!("{}", markdown_table(&records));
    println!("results: {}", out_dir.display());
    if let Some(bad) = records.iter().find(|r| !r.verified) {
        bail!("a transfer was not verified: {}", bad.summary());
    }
    Ok(())
}

/// The sessions cases: each count, through the gateways first (a "max" count is resolved
/// there), then direct.
fn run_sessions(args: &BenchArgs) -> Result<()> {
    use crate::sessions::{SessionsCase, markdown_table, run_case};
    let mut modes = args.mode.clone();
    if modes.is_empty() {
        modes = vec![Mode::Wsx, Mode::DirectCubic];
    }
    modes.sort_by_key(|m| !m.is_wsx());
    let binary = crate::build_lab_binary()?;
    wsx_lab::install_signal_cleanup()?;
    let out_dir = crate::workspace_root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let mut records = Vec::new();
    for &count in &args.sessions {
        let mut most = None;
        for &mode in &modes {
            let case = SessionsCase {
                mode,
                count,
                wan: args.wan.clone(),
                ipv6: args.ipv6,
                concurrency: args.concurrency,
                smb: args.sessions_smb,
                settings: request_settings(args, Fec::Adaptive),
            };
            let record = run_case(&case, &binary, &mut most)
                .with_context(|| format!("{} sessions {count:?}", mode.label()))?;
            println!("{}", record.summary());
            if let Some(path) = &args.json {
                append_json_line(path, &serde_json::to_string(&record)?)?;
            }
            records.push(record);
            std::fs::write(out_dir.join("sessions.md"), markdown_table(&records))?;
        }
    }
    println!("{}", markdown_table(&records));
    if let Some(bad) = records.iter().find(|r| !r.verified) {
        bail!("sessions not all verified: {}", bad.summary());
    }
    Ok(())
}

/// The request/response cases: each mode, and each wsx mode with each FEC setting.
fn run_exchanges(args: &BenchArgs, exchanges: usize) -> Result<()> {
    use crate::exchange::ExchangeCase;
    let mut modes = args.mode.clone();
    if modes.is_empty() {
        modes = vec![Mode::DirectBbr, Mode::Wsx];
    }
    let mut cases = Vec::new();
    for mode in modes {
        let fecs = if mode.is_wsx() {
            fecs(args)
        } else {
            vec![Fec::Adaptive]
        };
        for fec in fecs {
            for wsx_binary in &wsx_binaries(args, mode) {
                cases.push(ExchangeCase {
                    mode,
                    wan: args.wan.clone(),
                    ipv6: args.ipv6,
                    exchanges,
                    answer_bytes: args.answer_kib * 1024,
                    gateways: request_settings(args, fec),
                    wsx_binary: wsx_binary.clone(),
                });
            }
        }
    }
    let binary = crate::build_lab_binary()?;
    wsx_lab::install_signal_cleanup()?;
    crate::exchange::run(&cases, &binary, args.json.as_deref())
}

/// The SMB cases (`files` files of `file_bytes` read by `client`): each mode with each
/// gateway build.
fn run_smb(
    args: &BenchArgs,
    client: crate::smb::Client,
    files: usize,
    file_bytes: usize,
) -> Result<()> {
    use crate::smb::SmbCase;
    let mut modes = args.mode.clone();
    if modes.is_empty() {
        modes = vec![Mode::DirectBbr, Mode::Wsx];
    }
    let mut cases = Vec::new();
    for mode in modes {
        // Through the gateways: without SMB (smb = false: relayed as any TCP session) and
        // with it (the read-ahead engine), unless --smb-only.
        let smb: &[bool] = match (mode.is_wsx(), args.smb_only) {
            (false, _) => &[true],
            (true, true) => &[true],
            (true, false) => &[false, true],
        };
        // With SMB on, each validity window asked for (the gateways' default if none).
        let validities: Vec<Option<u32>> = if args.smb_validity_ms.is_empty() {
            vec![None]
        } else {
            args.smb_validity_ms.iter().copied().map(Some).collect()
        };
        let settings: Vec<(bool, Option<u32>)> = smb
            .iter()
            .flat_map(|&smb| {
                let validities = if smb && mode.is_wsx() {
                    validities.clone()
                } else {
                    vec![None]
                };
                validities.into_iter().map(move |v| (smb, v))
            })
            .collect();
        for wsx_binary in &wsx_binaries(args, mode) {
            for &(smb, smb_validity_ms) in &settings {
                cases.push(SmbCase {
                    mode,
                    wan: args.wan.clone(),
                    ipv6: args.ipv6,
                    client,
                    files,
                    file_bytes,
                    read_bytes: args.smb_read_kib << 10,
                    dialect: args.smb_dialect,
                    gateways: Settings {
                        smb,
                        smb_validity_ms,
                        ..request_settings(args, fecs(args)[0])
                    },
                    wsx_binary: wsx_binary.clone(),
                });
            }
        }
    }
    let binary = crate::build_lab_binary()?;
    wsx_lab::install_signal_cleanup()?;
    crate::smb::run(&cases, &binary, args.json.as_deref())
}

/// The gateways' settings of the request/response and SMB cases: `fec`, and compression
/// and the stated rate as asked; no shaper, the default datagram size.
fn request_settings(args: &BenchArgs, fec: Fec) -> Settings {
    Settings {
        fec,
        compression: !args.no_compression,
        shape_kbit: None,
        max_rate_mbit: args.max_rate_mbit,
        max_datagram: None,
        smb: true,
        smb_read_ahead_mib: args.smb_read_ahead_mib,
        smb_validity_ms: None,
    }
}

/// A dialect as `0x0210` or `210`.
fn parse_dialect(text: &str) -> Result<u16, String> {
    let digits = text.trim_start_matches("0x");
    u16::from_str_radix(digits, 16).map_err(|e| format!("a dialect in hexadecimal: {e}"))
}

/// The `max_datagram` settings asked for (the gateways' default if none).
fn max_datagrams(args: &BenchArgs) -> Vec<Option<u16>> {
    if args.max_datagram.is_empty() {
        vec![None]
    } else {
        args.max_datagram.iter().copied().map(Some).collect()
    }
}

/// The gateway builds asked for in `mode` (`None`: the one just built).
fn wsx_binaries(args: &BenchArgs, mode: Mode) -> Vec<Option<PathBuf>> {
    if mode.is_wsx() && !args.wsx_binary.is_empty() {
        args.wsx_binary.iter().cloned().map(Some).collect()
    } else {
        vec![None]
    }
}

/// The FEC settings asked for (adaptive if none).
fn fecs(args: &BenchArgs) -> Vec<Fec> {
    if args.fec.is_empty() {
        vec![Fec::Adaptive]
    } else {
        args.fec.clone()
    }
}

fn cases(args: &BenchArgs) -> Vec<Case> {
    let mut modes = args.mode.clone();
    let base = Case {
        mode: Mode::DirectCubic,
        wan: args.wan.clone(),
        flows: args.flows,
        seconds: args.seconds,
        warm_up_s: args.warm_up_seconds,
        payload: args.payload,
        ipv6: args.ipv6,
        gateways: Settings {
            fec: Fec::Adaptive,
            compression: !args.no_compression,
            shape_kbit: args.shape_mbit.map(|m| (m * 1000.0).round() as u64),
            max_rate_mbit: args.max_rate_mbit,
            max_datagram: None,
            smb: true,
            smb_read_ahead_mib: None,
            smb_validity_ms: None,
        },
        veth_mtu: None,
        wsx_binary: None,
    };
    match args.matrix {
        None => {
            if modes.is_empty() {
                modes.push(Mode::DirectCubic);
            }
            let mut cases = Vec::new();
            for mode in modes {
                let (fecs, datagrams) = if mode.is_wsx() {
                    (fecs(args), max_datagrams(args))
                } else {
                    (vec![Fec::Adaptive], vec![None])
                };
                let veth_mtus: Vec<Option<u16>> = if mode.is_veth() && !args.veth_mtu.is_empty() {
                    args.veth_mtu.iter().copied().map(Some).collect()
                } else {
                    vec![None]
                };
                for fec in fecs {
                    for &max_datagram in &datagrams {
                        for &veth_mtu in &veth_mtus {
                            for wsx_binary in &wsx_binaries(args, mode) {
                                cases.push(Case {
                                    mode,
                                    gateways: Settings {
                                        fec,
                                        max_datagram,
                                        ..base.gateways
                                    },
                                    veth_mtu,
                                    wsx_binary: wsx_binary.clone(),
                                    ..base.clone()
                                });
                            }
                        }
                    }
                }
            }
            cases
        }
        Some(Matrix::Default) => {
            if modes.is_empty() {
                modes = vec![Mode::DirectCubic, Mode::DirectBbr];
            }
            let mut cases = Vec::new();
            for &flows in &[1u16, 10] {
                for &rtt_ms in &[10.0, 50.0, 100.0, 200.0, 400.0] {
                    for &loss_pct in &[0.0, 0.1, 1.0, 5.0] {
                        for &mode in &modes {
                            let fec = fecs(args)[0];
                            let wan = WanSpec {
                                rtt_ms,
                                loss_pct,
                                queue_ms: None,
                                ..args.wan.clone()
                            };
                            cases.push(Case {
                                mode,
                                wan,
                                flows,
                                gateways: Settings {
                                    fec,
                                    ..base.gateways
                                },
                                ..base.clone()
                            });
                        }
                    }
                }
            }
            cases
        }
        Some(Matrix::Plots) => {
            if modes.is_empty() {
                modes = vec![Mode::DirectCubic, Mode::DirectBbr, Mode::Wsx];
            }
            let by_loss = [0.0, 0.5, 1.0, 2.0, 5.0, 10.0].map(|loss_pct| (100.0, loss_pct));
            let by_rtt = [10.0, 50.0, 200.0, 400.0, 600.0].map(|rtt_ms| (rtt_ms, 0.0));
            let mut cases = Vec::new();
            for (rtt_ms, loss_pct) in by_loss.into_iter().chain(by_rtt) {
                for &mode in &modes {
                    cases.push(Case {
                        mode,
                        wan: WanSpec {
                            rtt_ms,
                            loss_pct,
                            queue_ms: None,
                            ..args.wan.clone()
                        },
                        gateways: Settings {
                            fec: fecs(args)[0],
                            ..base.gateways
                        },
                        ..base.clone()
                    });
                }
            }
            cases
        }
        Some(Matrix::Fec) => {
            let mut cases = Vec::new();
            let iid = |loss_pct| WanSpec {
                rtt_ms: 100.0,
                loss_pct,
                queue_ms: None,
                ..args.wan.clone()
            };
            // Gilbert-Elliott: enter the lossy state with 0.34 % a packet, leave it with
            // 33 %: bursts of 3 on average, about 1 % of packets.
            let burst = WanSpec {
                burst_p_pct: Some(0.34),
                burst_r_pct: Some(33.0),
                ..iid(0.0)
            };
            for wan in [iid(0.0), iid(1.0), iid(5.0), burst] {
                for payload in [PayloadKind::Random, PayloadKind::Text] {
                    for fec in [Fec::Off, Fec::Adaptive] {
                        for compression in [false, true] {
                            cases.push(Case {
                                mode: Mode::Wsx,
                                wan: wan.clone(),
                                payload,
                                gateways: Settings {
                                    fec,
                                    compression,
                                    ..base.gateways
                                },
                                ..base.clone()
                            });
                        }
                    }
                }
            }
            cases
        }
    }
}

impl Case {
    fn describe(&self) -> String {
        format!(
            "{} {} ms {} %{} {} Mbit/s {} flow(s) {} s {:?}{}{}",
            self.mode.label(),
            self.wan.rtt_ms,
            self.wan.loss_pct,
            match (self.wan.burst_p_pct, self.wan.burst_r_pct) {
                (Some(p), Some(r)) => format!(" burst {p}/{r} %"),
                _ => String::new(),
            },
            self.wan.rate_mbit,
            self.flows,
            self.seconds,
            self.payload,
            if self.ipv6 { " IPv6" } else { "" },
            if self.mode.is_wsx() {
                format!(
                    " fec {} compression {}",
                    self.gateways.fec.as_str(),
                    if self.gateways.compression {
                        "on"
                    } else {
                        "off"
                    }
                )
            } else {
                String::new()
            }
        )
    }
}

/// Runs one case on a fresh lab.
/// Where a case's transfer runs: the lab, the binary, and each end's node, address and
/// tunnel keys (the sink listens on its address, the sender connects to its).
struct Ends<'a> {
    lab: &'a Lab,
    binary: &'a Path,
    sink: (Node, SocketAddr, &'a [String]),
    sender: (Node, SocketAddr, &'a [String]),
}

impl Ends<'_> {
    /// Starts the sink for the case's flows, its report to `json`, once it listens.
    fn start_sink(&self, case: &Case, json: &Path) -> Result<std::process::Child> {
        let (node, listen, keys) = self.sink;
        let mut sink = self.lab.command(node, self.binary);
        sink.args([
            "sink",
            "--listen",
            &listen.to_string(),
            "--flows",
            &case.flows.to_string(),
        ])
        .args(keys)
        .arg("--json")
        .arg(json);
        crate::shaping::spawn_ready(sink, "sink")
    }

    /// Sends the case's flows for `seconds`, its report to `json`.
    fn send(&self, case: &Case, seconds: f64, json: &Path) -> Result<std::process::ExitStatus> {
        let (node, to, keys) = self.sender;
        let mut sender = self.lab.command(node, self.binary);
        sender.args([
            "send",
            "--to",
            &to.to_string(),
            "--flows",
            &case.flows.to_string(),
            "--seconds",
            &seconds.to_string(),
            "--payload",
            match case.payload {
                PayloadKind::Random => "random",
                PayloadKind::Text => "text",
            },
        ]);
        sender.args(keys);
        if let Some(cc) = case.mode.congestion() {
            sender.args(["--cc", cc]);
        }
        Ok(sender
            .arg("--json")
            .arg(json)
            .stdout(Stdio::null())
            .status()?)
    }
}

pub(crate) fn run_case(case: &Case, binary: &Path) -> Result<Record> {
    let lab = match case.mode {
        Mode::WsxVeth => Lab::start_clean(case.veth_mtu.unwrap_or(1500))?,
        _ => Lab::start(&case.wan.emulator_config())?,
    };
    let work = tempdir(&lab)?;
    let (sink_node, sender_node, target) = case.mode.endpoints(case.ipv6);
    let entry = case.mode.entry(case.ipv6, target);
    let gateways = match case.mode {
        Mode::Wsx | Mode::WsxForward | Mode::WsxVeth => Some(crate::gateway::Pair::start_binary(
            &lab,
            &work,
            binary,
            case.wsx_binary.as_deref(),
            case.gateways,
            (entry != target).then_some((entry, target)),
        )?),
        _ => None,
    };
    if let (Mode::HtbCubic, Some(kbit)) = (case.mode, case.gateways.shape_kbit) {
        install_htb(&lab, kbit)?;
    }
    if let (Mode::TunnelVeth, Some(mtu)) = (case.mode, case.veth_mtu) {
        let mtu = mtu.to_string();
        for (node, dev) in [(Node::Client, "eth0"), (Node::GwA, "lan0")] {
            wsx_lab::netns::exec(
                &lab.netns(node),
                "ip",
                &["link", "set", "dev", dev, "mtu", &mtu],
            )
            .with_context(|| format!("setting the veth's MTU to {mtu}"))?;
        }
    }
    let sink_json = work.join("sink.json");
    let send_json = work.join("send.json");
    let (sink_keys, sender_keys) = if case.mode.is_tunnel() {
        let (a, b) = (SecretKey::generate(), SecretKey::generate());
        let args = |own: &SecretKey, peer: &SecretKey| {
            vec![
                "--tunnel-secret".to_string(),
                own.to_base64(),
                "--tunnel-peer".to_string(),
                peer.public_key().to_string(),
            ]
        };
        (args(&b, &a), args(&a, &b))
    } else {
        (Vec::new(), Vec::new())
    };

    let emulator_stats = || match case.mode {
        Mode::WsxVeth => Ok(EmulatorStats::default()),
        _ => lab.emulator().stats(),
    };
    let ends = Ends {
        lab: &lab,
        binary,
        sink: (sink_node, target, &sink_keys),
        sender: (sender_node, entry, &sender_keys),
    };
    if case.warm_up_s > 0.0 {
        // A tunnel in use recently: one transfer through the same gateways, then a second
        // with nothing to send.
        let mut sink = ends.start_sink(case, &work.join("warm-up-sink.json"))?;
        let sent = ends.send(case, case.warm_up_s, &work.join("warm-up-send.json"))?;
        let received = sink.wait()?;
        if !sent.success() || !received.success() {
            bail!("the warm-up transfer failed: sender {sent}, sink {received}");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let before = emulator_stats()?;
    let mut sink = ends.start_sink(case, &sink_json)?;
    let shaping = case
        .gateways
        .shape_kbit
        .filter(|_| case.mode.is_wsx() || case.mode == Mode::HtbCubic);
    if shaping.is_some() {
        lab.emulator()
            .mark_timeline(wsx_lab::emulator::Direction::AToB)?;
    }
    let send_status = ends.send(case, case.seconds, &send_json)?;
    let sink_status = sink.wait()?;
    let after = emulator_stats()?;
    let wire = match shaping {
        Some(_) => lab
            .emulator()
            .timeline(wsx_lab::emulator::Direction::AToB)?,
        None => Vec::new(),
    };
    let gateway_usage = gateways.map(|g| g.stop(&lab)).transpose()?;
    drop(lab);

    let sent: SendReport = read_json(&send_json).context("the sender's report")?;
    let received: SinkReport = read_json(&sink_json).context("the sink's report")?;
    let _ = std::fs::remove_dir_all(&work);
    if !send_status.success() || !sink_status.success() {
        let error = sent
            .flows
            .iter()
            .find_map(|f| f.error.clone())
            .or_else(|| received.flows.iter().find_map(|f| f.error.clone()));
        eprintln!("transfer failed: sender {send_status}, sink {sink_status}: {error:?}");
    }

    let fwd = after.a_to_b.since(&before.a_to_b);
    let rev = after.b_to_a.since(&before.b_to_a);
    let bytes: u64 = received.flows.iter().map(|f| f.bytes).sum();
    let origin = sent.origin_ns;
    let last = received
        .flows
        .iter()
        .map(|f| f.last_byte_ns)
        .max()
        .unwrap_or(origin);
    let duration_s = last.saturating_sub(origin) as f64 / 1e9;
    let goodput_mbit = if duration_s > 0.0 {
        bytes as f64 * 8.0 / duration_s / 1e6
    } else {
        0.0
    };
    let series = aggregate_series(&received);
    let steady_utilization = steady_mbit(&series) / case.wan.rate_mbit;
    let t90_ms = series
        .iter()
        .position(|&mbit| mbit >= 0.9 * case.wan.rate_mbit)
        .map(|i| (i as u64 + 1) * BUCKET_NS / 1_000_000);
    let ttfb_ms = received
        .flows
        .iter()
        .filter(|f| f.bytes > 0)
        .map(|f| f.first_byte_ns.saturating_sub(f.origin_ns) as f64 / 1e6)
        .fold(f64::INFINITY, f64::min);
    let per_flow: Vec<f64> = received.flows.iter().map(|f| f.bytes as f64).collect();
    let endpoints_cpu = sent.cpu_user_s + sent.cpu_sys_s + received.cpu_user_s + received.cpu_sys_s;
    let driver_cpu =
        |r: &Option<TunnelReport>| r.as_ref().map(|t| t.driver_user_s + t.driver_sys_s);
    let (gw_a, gw_b) = match &gateway_usage {
        Some([(a, _), (b, _)]) => (Some(a.user_s + a.sys_s), Some(b.user_s + b.sys_s)),
        None => (driver_cpu(&sent.tunnel), driver_cpu(&received.tunnel)),
    };
    let gateways = match (&gateway_usage, gw_a, gw_b) {
        (Some([(_, totals_a), (_, totals_b)]), Some(a), Some(b)) => Some(GatewayFigures::new(
            case.gateways,
            [totals_a, totals_b],
            [a, b],
            bytes,
        )),
        _ => None,
    };
    let tunnel = match (&sent.tunnel, &received.tunnel) {
        (Some(s), Some(r)) => Some(TunnelFigures::new(s, r, bytes)),
        _ => None,
    };
    // A clean veth has no bottleneck to be a fraction of.
    let bottleneck = !case.mode.is_veth();
    let t90_ms = t90_ms.filter(|_| bottleneck);
    Ok(Record {
        mode: case.mode,
        cc: sent.flows.first().map(|f| f.congestion.clone()),
        ip: if case.ipv6 { "ipv6" } else { "ipv4" },
        veth_mtu: case.veth_mtu,
        wsx_binary: case.wsx_binary.clone(),
        rtt_ms: case.wan.rtt_ms,
        loss_pct: case.wan.loss_pct,
        loss_dir: case.wan.loss_dir,
        burst_p_pct: case.wan.burst_p_pct,
        burst_r_pct: case.wan.burst_r_pct,
        rate_mbit: case.wan.rate_mbit,
        queue_ms: case.wan.queue_ms(),
        flows: case.flows,
        seconds: case.seconds,
        warm_up_s: case.warm_up_s,
        payload: case.payload,
        bytes,
        duration_s,
        goodput_mbit,
        utilization: if bottleneck {
            goodput_mbit / case.wan.rate_mbit
        } else {
            0.0
        },
        steady_utilization: if bottleneck { steady_utilization } else { 0.0 },
        t90_ms,
        ttfb_ms: if ttfb_ms.is_finite() { ttfb_ms } else { 0.0 },
        jain: jain(&per_flow),
        fwd_pkts: fwd.fwd_pkts,
        rev_pkts: rev.fwd_pkts,
        rev_per_fwd: if fwd.fwd_pkts > 0 {
            rev.fwd_pkts as f64 / fwd.fwd_pkts as f64
        } else {
            0.0
        },
        emu_drops: fwd.emulated_drops() + rev.emulated_drops(),
        emu_drops_fwd: DropBreakdown {
            random: fwd.drop_random,
            burst: fwd.drop_burst,
            queue: fwd.drop_queue,
        },
        queue_p50_ms: fwd.queue_delay_quantile(0.5).map(|ns| ns as f64 / 1e6),
        queue_p95_ms: fwd.queue_delay_quantile(0.95).map(|ns| ns as f64 / 1e6),
        emu_faults: fwd.emulator_faults + rev.emulator_faults,
        cpu_s: CpuSeconds {
            emulator: after.cpu_s() - before.cpu_s(),
            gw_a,
            gw_b,
            // The tunnel modes' drivers run inside the endpoint processes; the gateways of
            // the wsx mode are processes of their own.
            endpoints: endpoints_cpu
                - driver_cpu(&sent.tunnel).unwrap_or(0.0)
                - driver_cpu(&received.tunnel).unwrap_or(0.0),
        },
        max_rss_kb: match &gateway_usage {
            Some([(a, _), (b, _)]) => GatewayRss {
                gw_a: Some(a.max_rss_kb),
                gw_b: Some(b.max_rss_kb),
            },
            None => GatewayRss::default(),
        },
        verified: sent.verified()
            && received.verified()
            && send_status.success()
            && sink_status.success(),
        shaping: shaping.map(|kbit| {
            let held = match &gateway_usage {
                Some([(_, a), _]) => a.shaper_held_ms.map(|ms| ms as f64 / 1000.0),
                None => None,
            };
            ShapingFigures {
                held_at_max_s: held,
                flow_jain_per_second: flow_jain_per_second(case, &received),
                ..ShapingFigures::new(case, kbit, &series, &wire)
            }
        }),
        series_mbit: series,
        tunnel,
        gateways,
    })
}

/// HTB on gw-a's WAN interface at `kbit`: one class with a burst of 1 ms at the rate (at
/// least a full frame), a pfifo leaf. The interface's offloads are off (the lab's), so HTB
/// sees the frames as they leave.
fn install_htb(lab: &Lab, kbit: u64) -> Result<()> {
    let netns = lab.netns(Node::GwA);
    let burst = (kbit * 1000 / 8 / 1000).max(1600).to_string();
    let rate = format!("{kbit}kbit");
    let commands: [&[&str]; 3] = [
        &[
            "qdisc", "add", "dev", "wan0", "root", "handle", "1:", "htb", "default", "10",
        ],
        &[
            "class", "add", "dev", "wan0", "parent", "1:", "classid", "1:10", "htb", "rate", &rate,
            "ceil", &rate, "burst", &burst, "cburst", &burst,
        ],
        &[
            "qdisc", "add", "dev", "wan0", "parent", "1:10", "handle", "10:", "pfifo", "limit",
            "1000",
        ],
    ];
    for args in commands {
        wsx_lab::netns::exec(&netns, "tc", args).context("installing HTB on gw-a")?;
    }
    Ok(())
}

/// A shaping case's figures. Accuracy is measured at the sink (goodput over the run against
/// the goodput the rate stands for); precision at the wire, where the emulator records the
/// IP bytes gw-a sends per millisecond (each second's rate against the run's, and the
/// fullest millisecond against the rate's millisecond).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ShapingFigures {
    pub(crate) rate_mbit: f64,
    /// The goodput the rate stands for, by what each shaper counts: HTB counts Ethernet
    /// frames (1514 bytes carry 1448 of payload over IPv4 with TCP timestamps, 1428 over
    /// IPv6); wsx's shaper counts the bytes of the tunnel stream (16,387 carry 16,384 of
    /// payload: the chunk header of incompressible data).
    pub(crate) expected_goodput_mbit: f64,
    /// Goodput at the sink over the whole seconds from 2 s to the last full one, against
    /// the expected goodput (signed).
    pub(crate) run_error: f64,
    /// The same per one-second window (it includes the sink's head-of-line waits after a
    /// loss, which the wire does not show).
    pub(crate) sink_window_errors: Vec<f64>,
    /// The rate at the wire (IP bytes) over those seconds, Mbit/s.
    pub(crate) wire_mbit: f64,
    /// Each second's rate at the wire against `wire_mbit` (signed).
    pub(crate) wire_window_errors: Vec<f64>,
    pub(crate) max_wire_window_error: f64,
    /// The fullest millisecond at the wire over those seconds, bytes, and the bound it is
    /// held to: the wire rate's millisecond and two full frames (2 × 1514 bytes).
    pub(crate) max_ms_bytes: u64,
    pub(crate) ms_bound_bytes: u64,
    /// Milliseconds above the bound.
    pub(crate) ms_over_bound: u64,
    /// wsx: how long the scenario's maximum held it back over the whole case (the rest of
    /// the time something else, such as the tunnel, sent less than the maximum).
    #[serde(default)]
    pub(crate) held_at_max_s: Option<f64>,
    /// Jain's index of the flows' goodput at the sink in each second from 2 s to the last
    /// full one (with one flow, 1).
    #[serde(default)]
    pub(crate) flow_jain_per_second: Vec<f64>,
}

impl ShapingFigures {
    fn new(case: &Case, kbit: u64, series: &[f64], wire: &[u64]) -> Self {
        let rate_mbit = kbit as f64 / 1000.0;
        let payload_share = match (case.mode, case.ipv6) {
            (Mode::HtbCubic, false) => 1448.0 / 1514.0,
            (Mode::HtbCubic, true) => 1428.0 / 1514.0,
            _ => 16384.0 / 16387.0,
        };
        let expected = rate_mbit * payload_share;
        // Whole seconds the sender ran, from 2 s, less the last (it stops inside it).
        let seconds = 2..(case.seconds as usize).saturating_sub(1);
        let per_second = (1e9 / BUCKET_NS as f64) as usize;
        let sink: Vec<f64> = seconds
            .clone()
            .filter_map(|s| {
                let buckets = series.get(s * per_second..(s + 1) * per_second)?;
                Some(buckets.iter().sum::<f64>() / buckets.len() as f64)
            })
            .collect();
        let error = |mbit: f64, of: f64| if of > 0.0 { (mbit - of) / of } else { 0.0 };
        let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len().max(1) as f64;
        let wire_seconds: Vec<f64> = seconds
            .clone()
            .filter_map(|s| {
                let ms = wire.get(s * 1000..(s + 1) * 1000)?;
                Some(ms.iter().sum::<u64>() as f64 * 8.0 / 1e6)
            })
            .collect();
        let wire_mbit = mean(&wire_seconds);
        let wire_window_errors: Vec<f64> =
            wire_seconds.iter().map(|&w| error(w, wire_mbit)).collect();
        let during = wire
            .get(seconds.start * 1000..(seconds.end * 1000).min(wire.len()))
            .unwrap_or(&[]);
        let ms_bound_bytes = (wire_mbit * 1e6 / 8.0 / 1000.0) as u64 + 2 * 1514;
        Self {
            rate_mbit,
            expected_goodput_mbit: expected,
            run_error: error(mean(&sink), expected),
            sink_window_errors: sink.iter().map(|&w| error(w, expected)).collect(),
            wire_mbit,
            max_wire_window_error: wire_window_errors
                .iter()
                .fold(0.0f64, |m, e| m.max(e.abs())),
            wire_window_errors,
            max_ms_bytes: during.iter().copied().max().unwrap_or(0),
            ms_bound_bytes,
            ms_over_bound: during.iter().filter(|&&b| b > ms_bound_bytes).count() as u64,
            held_at_max_s: None,
            flow_jain_per_second: Vec::new(),
        }
    }
}

/// Jain's index of the flows' goodput at the sink in each whole second from 2 s to the
/// last full one.
fn flow_jain_per_second(case: &Case, received: &SinkReport) -> Vec<f64> {
    let per_second = (1e9 / BUCKET_NS as f64) as usize;
    (2..(case.seconds as usize).saturating_sub(1))
        .map(|s| {
            let bytes: Vec<f64> = received
                .flows
                .iter()
                .map(|f| {
                    let end = ((s + 1) * per_second).min(f.buckets.len());
                    let start = (s * per_second).min(end);
                    f.buckets[start..end].iter().sum::<u64>() as f64
                })
                .collect();
            jain(&bytes)
        })
        .collect()
}

pub(crate) fn tempdir(lab: &Lab) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("{}-bench", lab.name()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Appends one record (a JSON line) to `path`, so that several runs collect into one file.
pub(crate) fn append_json_line(path: &Path, line: &str) -> Result<()> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| writeln!(f, "{line}"))
        .with_context(|| format!("appending to {}", path.display()))
}

pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The flows' combined goodput in each 100 ms bucket, Mbit/s.
fn aggregate_series(report: &SinkReport) -> Vec<f64> {
    let len = report
        .flows
        .iter()
        .map(|f| f.buckets.len())
        .max()
        .unwrap_or(0);
    let mut total = vec![0u64; len];
    for flow in &report.flows {
        for (slot, bytes) in total.iter_mut().zip(&flow.buckets) {
            *slot += bytes;
        }
    }
    total
        .iter()
        .map(|&b| b as f64 * 8.0 / (BUCKET_NS as f64 / 1e9) / 1e6)
        .collect()
}

/// Where the steady state is taken to begin: 30 round trips at 100 ms, well past any start-up.
const STEADY_FROM_MS: u64 = 3000;

/// Mean of `series` from [`STEADY_FROM_MS`] on, leaving out the last bucket (the transfer
/// usually ends inside it); 0 for a run too short to have a steady state.
fn steady_mbit(series: &[f64]) -> f64 {
    let from = (STEADY_FROM_MS * 1_000_000 / BUCKET_NS) as usize;
    match series.get(from..series.len().saturating_sub(1)) {
        Some(steady) if !steady.is_empty() => steady.iter().sum::<f64>() / steady.len() as f64,
        _ => 0.0,
    }
}

/// Jain's fairness index: (Σx)² / (n Σx²).
pub(crate) fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    if squares == 0.0 {
        0.0
    } else {
        sum * sum / (xs.len() as f64 * squares)
    }
}

impl Record {
    /// RTT (ms), loss (%) and rate (Mbit/s) of the emulated WAN, or dashes on a clean veth,
    /// which has none of them.
    fn wan_cells(&self) -> [String; 3] {
        if self.mode.is_veth() {
            ["-".into(), "-".into(), "-".into()]
        } else {
            [
                self.rtt_ms.to_string(),
                self.loss_pct.to_string(),
                self.rate_mbit.to_string(),
            ]
        }
    }

    pub(crate) fn summary(&self) -> String {
        let [rtt, loss, _] = self.wan_cells();
        format!(
            "{:<12} {:>5} ms {:>4} % {:>2} flow(s): {:>8.2} Mbit/s ({:>5.1} %, steady {:>5.1} %), t90 {}, queue p95 {}, rev/fwd {:.3}, cpu emu {:.2} s{}{}{}{}{}",
            self.mode.label(),
            rtt,
            loss,
            self.flows,
            self.goodput_mbit,
            self.utilization * 100.0,
            self.steady_utilization * 100.0,
            self.t90_ms.map_or("never".into(), |t| format!("{t} ms")),
            self.queue_p95_ms.map_or("-".into(), |q| format!("{q:.1} ms")),
            self.rev_per_fwd,
            self.cpu_s.emulator,
            match (self.cpu_s.gw_a, self.cpu_s.gw_b, &self.tunnel) {
                (Some(a), Some(b), None) => format!(", gateway cpu {a:.2}/{b:.2} s"),
                _ => String::new(),
            },
            self.gateways.as_ref().map_or(String::new(), |g| format!(
                "{}, datagrams {} B{}, {}, fec {} parity {:.1} %, recovered {} retransmitted {}, wire/plain {:.3}, loss read {:.2}/{:.2} %, gw-b sent {} data {} ack-only {} parity",
                g.max_rate_mbit.map_or(String::new(), |m| format!(", max rate {m} Mbit/s")),
                g.datagram_bytes,
                g.max_datagram.map_or(String::new(), |d| format!(" (max_datagram {d})")),
                g.cipher.as_deref().unwrap_or("cipher unknown"),
                g.fec.as_str(),
                g.fec_overhead * 100.0,
                g.recovered,
                g.retransmitted,
                g.wire_per_plain,
                g.loss_read_pct[0],
                g.loss_read_pct[1],
                g.reverse_packets.data,
                g.reverse_packets.ack_only,
                g.reverse_packets.parity,
            )),
            self.tunnel.as_ref().map_or(String::new(), |t| format!(
                ", tunnel cpu {:.2}/{:.2} s/GB, datagrams {} B{} ({} black holes), {:.1} dgrams/send, {:.1}/receive, acks/data {:.4}, rtt min/smoothed {:.1}/{:.1} ms, bottleneck estimate {:.1} Mbit/s, {} congestion events",
                t.send_cpu_s_per_gb,
                t.recv_cpu_s_per_gb,
                t.datagram_bytes,
                self.veth_mtu.map_or(String::new(), |m| format!(" (veth mtu {m})")),
                t.mtu_black_holes,
                t.datagrams_per_send,
                t.datagrams_per_receive,
                t.acks_per_data,
                t.min_rtt_ms,
                t.smoothed_rtt_ms,
                t.bottleneck_mbit,
                t.congestion_events
            )),
            self.wsx_binary
                .as_ref()
                .map_or(String::new(), |b| format!(", binary {}", b.display())),
            match (self.verified, self.emu_faults) {
                (false, _) => "  NOT VERIFIED".to_string(),
                (true, 0) => String::new(),
                (true, n) => format!("  INVALID: {n} emulator faults"),
            }
        )
    }
}

pub(crate) fn markdown_table(records: &[Record]) -> String {
    let mut s = String::from(
        "| mode | cc | RTT ms | loss % | rate Mbit/s | flows | goodput Mbit/s | util % | steady util % | t90 ms | queue p50 / p95 ms | Jain | rev/fwd pkts | emu drops | CPU s emu / endpoints | verified |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in records {
        let [rtt, loss, rate] = r.wan_cells();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {:.2} | {:.1} | {:.1} | {} | {} | {:.3} | {:.3} | {} | {:.2} / {:.2} | {} |",
            r.mode.label(),
            r.cc.as_deref().unwrap_or("-"),
            rtt,
            loss,
            rate,
            r.flows,
            r.goodput_mbit,
            r.utilization * 100.0,
            r.steady_utilization * 100.0,
            r.t90_ms.map_or("-".into(), |t| t.to_string()),
            match (r.queue_p50_ms, r.queue_p95_ms) {
                (Some(p50), Some(p95)) => format!("{p50:.1} / {p95:.1}"),
                _ => "-".into(),
            },
            r.jain,
            r.rev_per_fwd,
            r.emu_drops,
            r.cpu_s.emulator,
            r.cpu_s.endpoints,
            match (r.verified, r.emu_faults) {
                (false, _) => "**no**".to_string(),
                (true, 0) => "yes".to_string(),
                (true, n) => format!("yes, but {n} emulator faults"),
            }
        );
    }
    let gateway_rows: Vec<(&Record, &GatewayFigures)> = records
        .iter()
        .filter_map(|r| Some((r, r.gateways.as_ref()?)))
        .collect();
    if !gateway_rows.is_empty() {
        s += "\n| RTT ms | loss | payload | FEC | compression | goodput Mbit/s | util % | retransmitted | recovered by FEC | parity/data % | wire/plain | CPU s/GB gw-a / gw-b | verified |\n\
              |---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n";
        for (r, g) in gateway_rows {
            let [rtt, loss, _] = r.wan_cells();
            let _ = writeln!(
                s,
                "| {} | {} | {:?} | {} | {} | {:.1} | {:.1} | {} | {} | {:.1} | {:.3} | {:.2} / {:.2} | {} |",
                rtt,
                match (r.burst_p_pct, r.burst_r_pct) {
                    (Some(p), Some(q)) => format!("{loss} % + burst {p}/{q} %"),
                    _ if r.mode.is_veth() => loss,
                    _ => format!("{loss} %"),
                },
                r.payload,
                g.fec.as_str(),
                if g.compression { "on" } else { "off" },
                r.goodput_mbit,
                r.utilization * 100.0,
                g.retransmitted,
                g.recovered,
                g.fec_overhead * 100.0,
                g.wire_per_plain,
                g.cpu_s_per_gb[0],
                g.cpu_s_per_gb[1],
                if r.verified { "yes" } else { "**no**" },
            );
        }
    }
    let shaped: Vec<(&Record, &ShapingFigures)> = records
        .iter()
        .filter_map(|r| Some((r, r.shaping.as_ref()?)))
        .collect();
    if !shaped.is_empty() {
        s.push_str(
            "\n| mode | shaped to Mbit/s | flows | RTT ms | goodput Mbit/s (expected) | run error % | \
             wire Mbit/s | worst 1 s at the wire % | fullest ms / bound bytes | ms over | Jain over the run / worst second | CPU s gw-a / emu | verified |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
        );
        for (r, f) in shaped {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.3} ({:.3}) | {:+.3} | {:.3} | {:.3} | {} / {} | {} | {:.3} / {:.3} | {} / {:.1} | {} |",
                r.mode.label(),
                f.rate_mbit,
                r.flows,
                r.rtt_ms,
                r.goodput_mbit,
                f.expected_goodput_mbit,
                f.run_error * 100.0,
                f.wire_mbit,
                f.max_wire_window_error * 100.0,
                f.max_ms_bytes,
                f.ms_bound_bytes,
                f.ms_over_bound,
                r.jain,
                f.flow_jain_per_second
                    .iter()
                    .copied()
                    .fold(1.0f64, f64::min),
                r.cpu_s.gw_a.map_or("-".into(), |c| format!("{c:.1}")),
                r.cpu_s.emulator,
                if r.verified { "yes" } else { "**no**" },
            );
        }
    }
    s
}

fn write_outputs(records: &[Record], dir: &Path, json: Option<&Path>) -> Result<()> {
    let mut lines = String::new();
    for r in records {
        lines += &serde_json::to_string(r)?;
        lines.push('\n');
    }
    std::fs::write(dir.join("results.jsonl"), &lines)?;
    // Called after every case with all records so far: the appended file gets the newest.
    if let (Some(path), Some(newest)) = (json, records.last()) {
        append_json_line(path, &serde_json::to_string(newest)?)?;
    }
    std::fs::write(dir.join("results.md"), markdown_table(records))?;
    write_charts(records, dir)
}

/// Goodput against RTT (at the lowest loss measured) and against loss (at 100 ms RTT, or the
/// RTT measured closest to it), one series per mode and flow count, like the reference
/// appliance's published figures.
fn write_charts(records: &[Record], dir: &Path) -> Result<()> {
    let mut rtts: Vec<f64> = records.iter().map(|r| r.rtt_ms).collect();
    let mut losses: Vec<f64> = records.iter().map(|r| r.loss_pct).collect();
    for v in [&mut rtts, &mut losses] {
        v.sort_by(f64::total_cmp);
        v.dedup();
    }
    let (Some(&min_loss), Some(&rtt_ref)) = (
        losses.first(),
        rtts.iter()
            .min_by(|a, b| (*a - 100.0).abs().total_cmp(&(*b - 100.0).abs())),
    ) else {
        return Ok(());
    };
    let mut groups: Vec<(Mode, u16)> = records.iter().map(|r| (r.mode, r.flows)).collect();
    groups.sort_by_key(|&(m, f)| (m.label(), f));
    groups.dedup();
    let series = |x_values: &[f64], pick: &dyn Fn(&Record, f64) -> bool| -> Vec<Series> {
        groups
            .iter()
            .map(|&(mode, flows)| Series {
                name: format!("{} ×{}", mode.label(), flows),
                values: x_values
                    .iter()
                    .map(|&x| {
                        records
                            .iter()
                            .find(|r| r.mode == mode && r.flows == flows && pick(r, x))
                            .map(|r| r.goodput_mbit)
                    })
                    .collect(),
            })
            .collect()
    };
    let rate = records.first().map_or(0.0, |r| r.rate_mbit);
    let by_rtt = line_chart(
        &format!("Goodput vs RTT ({min_loss} % loss, {rate} Mbit/s link)"),
        "RTT (ms)",
        "goodput (Mbit/s)",
        &rtts.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
        &series(&rtts, &|r, x| r.rtt_ms == x && r.loss_pct == min_loss),
    );
    let by_loss = line_chart(
        &format!("Goodput vs loss ({rtt_ref} ms RTT, {rate} Mbit/s link)"),
        "random loss (%)",
        "goodput (Mbit/s)",
        &losses.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
        &series(&losses, &|r, x| r.loss_pct == x && r.rtt_ms == rtt_ref),
    );
    std::fs::write(dir.join("goodput_vs_rtt.svg"), by_rtt)?;
    std::fs::write(dir.join("goodput_vs_loss.svg"), by_loss)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_index_is_one_for_equal_flows_and_one_over_n_for_a_single_hog() {
        assert!((jain(&[5.0, 5.0, 5.0, 5.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[8.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        assert_eq!(jain(&[]), 0.0);
    }

    #[test]
    fn steady_state_skips_the_first_three_seconds_and_the_last_bucket() {
        let mut series = vec![10.0; 30];
        series.extend([90.0, 100.0, 5.0]);
        assert_eq!(steady_mbit(&series), 95.0);
        assert_eq!(steady_mbit(&series[..31]), 0.0);
    }

    /// The arguments as `cargo xtask bench` would parse them from `line`.
    fn parse(line: &str) -> BenchArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: BenchArgs,
        }
        let words = std::iter::once("bench").chain(line.split_whitespace());
        <Cli as clap::Parser>::try_parse_from(words)
            .unwrap_or_else(|e| panic!("{e}"))
            .args
    }

    #[test]
    fn each_fec_setting_is_a_case_of_each_wsx_mode() {
        let compared = cases(&parse("--mode direct-bbr --mode wsx --fec off --fec on"));
        let got: Vec<_> = compared
            .iter()
            .map(|c| (c.mode, c.mode.is_wsx().then_some(c.gateways.fec)))
            .collect();
        assert_eq!(
            got,
            [
                (Mode::DirectBbr, None),
                (Mode::Wsx, Some(Fec::Off)),
                (Mode::Wsx, Some(Fec::On)),
            ]
        );
        let default = cases(&parse("--mode wsx"));
        assert_eq!(default.len(), 1);
        assert_eq!(default[0].gateways.fec, Fec::Adaptive);
    }

    #[test]
    fn the_plots_sweep_loss_at_100_ms_and_rtt_without_loss() {
        let plots = cases(&parse("--matrix plots --seconds 1"));
        assert_eq!(plots.len(), 11 * 3);
        let points = |mode| {
            plots
                .iter()
                .filter(|c| c.mode == mode)
                .map(|c| (c.wan.rtt_ms, c.wan.loss_pct))
                .collect::<Vec<_>>()
        };
        assert_eq!(points(Mode::Wsx), points(Mode::DirectCubic));
        assert!(points(Mode::Wsx).contains(&(100.0, 10.0)));
        assert!(points(Mode::Wsx).contains(&(600.0, 0.0)));
    }

    #[test]
    fn default_matrix_covers_every_combination() {
        let args = parse("--matrix default --seconds 1");
        let cases = cases(&args);
        assert_eq!(cases.len(), 5 * 4 * 2 * 2);
        assert!(
            cases
                .iter()
                .any(|c| c.wan.rtt_ms == 400.0 && c.wan.loss_pct == 5.0 && c.flows == 10)
        );
    }
}
