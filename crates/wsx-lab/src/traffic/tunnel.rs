//! Verified traffic carried memory-to-memory by the tunnel driver alone: the benchmark's
//! tunnel-only mode, with no TCP and no proxy in the path.
//!
//! The sender (in gw-a) and the sink (in gw-b) each run a [`Driver`]; each flow is one
//! tunnel stream carrying the same header, payload and receipt as a TCP flow, so the sink
//! checks every byte the same way. The driver runs on a thread of its own, so that its CPU
//! time (encryption, system calls, the protocol) is measured apart from generating and
//! checking the payload.

use super::send::{Source, check_receipt, header};
use super::sink::Check;
use super::{FlowReport, HEADER_LEN, RECEIPT_LEN, Receipt, SendOptions, SendReport, SentFlow};
use super::{SinkOptions, SinkReport};
use crate::sys::{self, Usage};
use anyhow::{Context, Result, anyhow};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wsx_tunnel::driver::{Driver, DriverStats, Stream, Tunnel};
use wsx_tunnel::{ConnectionStats, EndpointConfig, PublicKey, SecretKey, StreamMeta};

/// The keys of one side of the tunnel.
#[derive(Clone, Debug)]
pub struct TunnelKeys {
    pub secret: SecretKey,
    pub peer: PublicKey,
}

/// What the tunnel did on one side.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TunnelReport {
    /// CPU seconds of the driver's thread.
    pub driver_user_s: f64,
    pub driver_sys_s: f64,
    pub datagrams_sent: u64,
    pub send_calls: u64,
    pub datagrams_received: u64,
    pub receive_calls: u64,
    /// Packets that carried data (or control, or PINGs).
    pub eliciting_sent: u64,
    /// Packets that carried only acknowledgements.
    pub ack_only_sent: u64,
    pub packets_lost: u64,
    pub min_rtt_ms: f64,
    pub smoothed_rtt_ms: f64,
    /// The congestion controller's bottleneck estimate at the end, Mbit/s of UDP payload
    /// (0 for a controller that keeps none), and its congestion reactions.
    #[serde(default)]
    pub bottleneck_mbit: f64,
    #[serde(default)]
    pub congestion_events: u64,
    /// The datagram size the connection used at the end (path MTU discovery), and the
    /// times it fell back to 1200 bytes after full-size packets stopped getting through.
    #[serde(default)]
    pub datagram_bytes: u64,
    #[serde(default)]
    pub mtu_black_holes: u64,
}

impl TunnelReport {
    fn new(driver: &DriverStats, connection: &ConnectionStats, usage: Usage) -> Self {
        Self {
            driver_user_s: usage.user_s,
            driver_sys_s: usage.sys_s,
            datagrams_sent: driver.datagrams_sent,
            send_calls: driver.send_calls,
            datagrams_received: driver.datagrams_received,
            receive_calls: driver.receive_calls,
            eliciting_sent: connection.eliciting_sent,
            ack_only_sent: connection.ack_only_sent,
            packets_lost: connection.packets_lost,
            min_rtt_ms: connection.min_rtt.as_secs_f64() * 1e3,
            smoothed_rtt_ms: connection.smoothed_rtt.as_secs_f64() * 1e3,
            bottleneck_mbit: connection
                .congestion
                .map_or(0.0, |c| c.bottleneck_rate as f64 * 8.0 / 1e6),
            congestion_events: connection.congestion.map_or(0, |c| c.congestion_events),
            datagram_bytes: u64::from(connection.datagram_size),
            mtu_black_holes: connection.mtu.black_holes,
        }
    }
}

/// Connects to the sink at `to`, sends `options.flows` streams and waits for their receipts.
pub fn tunnel_send(to: SocketAddr, keys: &TunnelKeys, options: &SendOptions) -> Result<SendReport> {
    let bind = if to.is_ipv6() {
        SocketAddr::from(([0u16; 8], 0))
    } else {
        SocketAddr::from(([0u8; 4], 0))
    };
    let io = IoThread::start(bind, keys)?;
    let runtime = runtime()?;
    let result = runtime.block_on(async {
        let tunnel = io.driver.connect(to, keys.peer).context("connecting")?;
        tokio::time::timeout(options.receipt_timeout, tunnel.established())
            .await
            .context("the handshake timed out")?
            .context("the handshake failed")?;
        // The tunnel is long-lived in a gateway: time counts from when it is up.
        let origin_ns = sys::monotonic_ns();
        let mut flows = Vec::new();
        for flow in 0..options.flows {
            let stream = tunnel
                .open(StreamMeta::default())
                .context("opening a stream")?;
            let options = options.clone();
            flows.push(tokio::spawn(async move {
                let mut report = SentFlow {
                    flow,
                    bytes: 0,
                    confirmed: 0,
                    verified: false,
                    congestion: "wsx-tunnel".into(),
                    error: None,
                };
                if let Err(e) = send_flow(stream, &options, origin_ns, &mut report).await {
                    report.error = Some(format!("{e:#}"));
                }
                report
            }));
        }
        let mut reports = Vec::new();
        for f in flows {
            reports.push(f.await.context("a sender task failed")?);
        }
        let stats = tunnel.stats();
        anyhow::Ok((origin_ns, reports, stats))
    });
    let (driver_stats, usage) = io.stop(&runtime);
    let (origin_ns, flows, stats) = result?;
    let process = sys::process_usage();
    Ok(SendReport {
        origin_ns,
        flows,
        cpu_user_s: process.user_s,
        cpu_sys_s: process.sys_s,
        tunnel: Some(TunnelReport::new(&driver_stats, &stats, usage)),
    })
}

async fn send_flow(
    mut stream: Stream,
    options: &SendOptions,
    origin_ns: u64,
    report: &mut SentFlow,
) -> Result<()> {
    stream
        .write_all(&header(options, report.flow, origin_ns).emit())
        .await?;
    let mut source = Source::new(options, report.flow, origin_ns);
    while let Some(chunk) = source.next_chunk() {
        stream.write_all(chunk).await.context("writing")?;
        report.bytes += chunk.len() as u64;
    }
    stream.shutdown().await?;
    let mut receipt = [0u8; RECEIPT_LEN];
    tokio::time::timeout(options.receipt_timeout, stream.read_exact(&mut receipt))
        .await
        .context("waiting for the sink's receipt")??;
    // Read the sink's end too, so that the stream closes rather than being reset.
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).await?;
    check_receipt(&receipt, report)
}

/// Listens at `listen`, calls `ready` with the address once it does, accepts one tunnel and
/// `options.flows` streams on it, and verifies them all.
pub fn tunnel_sink(
    listen: SocketAddr,
    keys: &TunnelKeys,
    options: SinkOptions,
    ready: impl FnOnce(SocketAddr),
) -> Result<SinkReport> {
    let io = IoThread::start(listen, keys)?;
    ready(io.driver.local_addr());
    let runtime = runtime()?;
    let result = runtime.block_on(async {
        let tunnel = io
            .driver
            .accept()
            .await
            .ok_or_else(|| anyhow!("the driver stopped"))?;
        let mut flows = Vec::new();
        for _ in 0..options.flows {
            let stream = accept_stream(&tunnel, options).await?;
            flows.push(tokio::spawn(receive_flow(stream, options)));
        }
        let mut reports = Vec::new();
        for f in flows {
            reports.push(f.await.context("a sink task failed")?);
        }
        reports.sort_by_key(|f: &FlowReport| f.flow);
        let stats = tunnel.stats();
        // The sender closes once it has every receipt; wait for that, so the last receipts
        // are acknowledged before this side goes away.
        let _ = tokio::time::timeout(options.idle_timeout, tunnel.closed()).await;
        anyhow::Ok((reports, stats))
    });
    let (driver_stats, usage) = io.stop(&runtime);
    let (flows, stats) = result?;
    let process = sys::process_usage();
    Ok(SinkReport {
        flows,
        cpu_user_s: process.user_s,
        cpu_sys_s: process.sys_s,
        tunnel: Some(TunnelReport::new(&driver_stats, &stats, usage)),
    })
}

async fn accept_stream(tunnel: &Tunnel, options: SinkOptions) -> Result<Stream> {
    tokio::time::timeout(options.idle_timeout, tunnel.accept_stream())
        .await
        .context("no stream arrived")?
        .context("the tunnel ended")
}

async fn receive_flow(mut stream: Stream, options: SinkOptions) -> FlowReport {
    let mut report = FlowReport::default();
    let outcome = tokio::time::timeout(options.idle_timeout, try_receive(&mut stream, &mut report))
        .await
        .unwrap_or_else(|_| Err(anyhow!("the flow stalled")));
    match outcome {
        Ok(()) => report.verified = true,
        Err(e) => report.error = Some(format!("{e:#}")),
    }
    let receipt = Receipt {
        verified: report.verified,
        bytes: report.bytes,
    };
    if stream.write_all(&receipt.emit()).await.is_ok() {
        let _ = stream.shutdown().await;
    }
    report
}

async fn try_receive(stream: &mut Stream, report: &mut FlowReport) -> Result<()> {
    let mut header = [0u8; HEADER_LEN];
    stream
        .read_exact(&mut header)
        .await
        .context("reading the stream header")?;
    let mut check = Check::new(&header, report)?;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = stream
            .read(&mut buf)
            .await
            .with_context(|| format!("reading after {} bytes", report.bytes))?;
        if n == 0 {
            break;
        }
        check.data(&buf[..n], report)?;
    }
    check.end(report)
}

/// The traffic's side: one thread.
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the traffic runtime")
}

/// The driver on a thread and runtime of its own.
struct IoThread {
    driver: Driver,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<Usage>,
}

impl IoThread {
    fn start(bind: SocketAddr, keys: &TunnelKeys) -> Result<Self> {
        let config = EndpointConfig::new(keys.secret.clone(), vec![keys.peer], fastrand::u64(..));
        let (started, driver) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("tunnel-io".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = started.send(Err(e));
                        return Usage::default();
                    }
                };
                runtime.block_on(async {
                    match Driver::bind(bind, config) {
                        Ok(driver) => {
                            let _ = started.send(Ok(driver));
                            let _ = stopped.await;
                        }
                        Err(e) => {
                            let _ = started.send(Err(e));
                        }
                    }
                });
                sys::thread_usage()
            })?;
        let driver = driver
            .recv()
            .context("the driver thread died")?
            .with_context(|| format!("binding the tunnel at {bind}"))?;
        Ok(Self {
            driver,
            stop,
            thread,
        })
    }

    /// Shuts the driver down (closing its connections once what they carry is delivered)
    /// and returns its counters and the CPU time of its thread.
    fn stop(self, runtime: &tokio::runtime::Runtime) -> (DriverStats, Usage) {
        let stats = self.driver.stats();
        runtime.block_on(self.driver.shutdown(Duration::from_secs(2)));
        let _ = self.stop.send(());
        let usage = self.thread.join().unwrap_or_default();
        (stats, usage)
    }
}
