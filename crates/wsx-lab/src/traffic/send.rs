//! The sending side.

use super::{Header, Payload, PayloadKind, RECEIPT_LEN, Receipt};
use crate::sys;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// What to send.
#[derive(Clone, Debug)]
pub struct SendOptions {
    /// The sink.
    pub to: SocketAddr,
    /// Parallel TCP connections.
    pub flows: u16,
    /// Bytes per flow; `None` sends for `seconds`.
    pub bytes: Option<u64>,
    /// Duration of a timed run.
    pub seconds: f64,
    /// TCP congestion control for the sockets (`TCP_CONGESTION`); `None` keeps the namespace's.
    pub congestion: Option<String>,
    /// What the payload looks like.
    pub payload: PayloadKind,
    /// Seed of the payload streams.
    pub seed: u64,
    /// How long to wait for the sink's receipt after the last byte, and the longest one
    /// write may wait for the path to take data.
    pub receipt_timeout: Duration,
    /// Each flow writes at most this many bits per second, in 10 ms portions (a flow
    /// limited by its application); `None`: as fast as TCP takes it.
    pub rate_bps: Option<u64>,
}

/// What the sender did, per flow.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SendReport {
    /// Start of the run (`CLOCK_MONOTONIC` ns); the sink's buckets count from here.
    pub origin_ns: u64,
    /// One entry per flow.
    pub flows: Vec<SentFlow>,
    /// User CPU seconds of the sender process.
    pub cpu_user_s: f64,
    /// System CPU seconds of the sender process.
    pub cpu_sys_s: f64,
    /// The tunnel's side of the run, when the flows were tunnel streams.
    #[serde(default)]
    pub tunnel: Option<super::TunnelReport>,
}

impl SendReport {
    /// Every flow's bytes were confirmed by the sink, byte for byte.
    pub fn verified(&self) -> bool {
        !self.flows.is_empty() && self.flows.iter().all(|f| f.verified)
    }
}

/// One flow, from the sender's side.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SentFlow {
    /// Flow number.
    pub flow: u16,
    /// Payload bytes written.
    pub bytes: u64,
    /// Payload bytes the sink says it received.
    pub confirmed: u64,
    /// The sink confirmed every byte and the counts agree.
    pub verified: bool,
    /// The congestion control the kernel used.
    pub congestion: String,
    /// What went wrong, if anything.
    pub error: Option<String>,
}

/// Runs the sender to completion.
pub fn send(options: &SendOptions) -> Result<SendReport> {
    let origin_ns = sys::monotonic_ns();
    let handles: Vec<_> = (0..options.flows)
        .map(|flow| {
            let options = options.clone();
            std::thread::Builder::new()
                .name(format!("send-{flow}"))
                .spawn(move || send_flow(&options, flow, origin_ns))
        })
        .collect::<Result<_, _>>()?;
    let flows = handles
        .into_iter()
        .zip(0..)
        .map(|(h, flow)| {
            h.join().unwrap_or_else(|_| SentFlow {
                flow,
                bytes: 0,
                confirmed: 0,
                verified: false,
                congestion: String::new(),
                error: Some("sender thread panicked".into()),
            })
        })
        .collect();
    let usage = sys::process_usage();
    Ok(SendReport {
        origin_ns,
        flows,
        cpu_user_s: usage.user_s,
        cpu_sys_s: usage.sys_s,
        tunnel: None,
    })
}

fn send_flow(options: &SendOptions, flow: u16, origin_ns: u64) -> SentFlow {
    let mut report = SentFlow {
        flow,
        bytes: 0,
        confirmed: 0,
        verified: false,
        congestion: String::new(),
        error: None,
    };
    if let Err(e) = try_send_flow(options, flow, origin_ns, &mut report) {
        report.error = Some(format!("{e:#}"));
    }
    report
}

fn try_send_flow(
    options: &SendOptions,
    flow: u16,
    origin_ns: u64,
    report: &mut SentFlow,
) -> Result<()> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(options.to),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    report.congestion = match &options.congestion {
        Some(cc) => sys::set_tcp_congestion(socket.as_raw_fd(), cc)
            .with_context(|| format!("setting TCP_CONGESTION {cc}"))?,
        None => sys::set_tcp_congestion(socket.as_raw_fd(), "")
            .or_else(|_| Ok::<_, std::io::Error>(String::from("default")))?,
    };
    socket
        .connect(&options.to.into())
        .with_context(|| format!("connecting to {}", options.to))?;
    let mut stream: TcpStream = socket.into();
    // A path that stops moving fails the flow instead of blocking it for ever.
    stream.set_write_timeout(Some(options.receipt_timeout))?;
    let header = header(options, flow, origin_ns);
    stream.write_all(&header.emit())?;
    let mut source = Source::new(options, flow, origin_ns);
    while let Some(chunk) = source.next_chunk() {
        stream.write_all(chunk).context("writing")?;
        report.bytes += chunk.len() as u64;
    }
    stream.shutdown(Shutdown::Write)?;

    stream.set_read_timeout(Some(options.receipt_timeout))?;
    let mut receipt = [0u8; RECEIPT_LEN];
    stream
        .read_exact(&mut receipt)
        .context("waiting for the sink's receipt")?;
    check_receipt(&receipt, report)
}

/// The header that starts flow `flow`.
pub(super) fn header(options: &SendOptions, flow: u16, origin_ns: u64) -> Header {
    Header {
        kind: options.payload,
        flow,
        seed: options.seed,
        origin_ns,
        total_bytes: options.bytes.unwrap_or(0),
    }
}

/// The payload of one flow, chunk by chunk, until its byte count or deadline.
pub(super) struct Source {
    payload: Payload,
    chunk: Vec<u8>,
    remaining: Option<u64>,
    deadline_ns: u64,
    /// A rate-limited flow's rate (bit/s), origin and bytes handed out so far.
    pace: Option<(u64, u64, u64)>,
}

impl Source {
    pub(super) fn new(options: &SendOptions, flow: u16, origin_ns: u64) -> Self {
        // A rate-limited flow writes 10 ms of its rate at a time.
        let chunk = options.rate_bps.map_or(128 * 1024, |bps| {
            (bps / 8 / 100).clamp(1, 128 * 1024) as usize
        });
        Self {
            payload: Payload::new(options.payload, options.seed, flow),
            chunk: vec![0u8; chunk],
            remaining: options.bytes,
            deadline_ns: origin_ns + (options.seconds * 1e9) as u64,
            pace: options.rate_bps.map(|bps| (bps, origin_ns, 0)),
        }
    }

    /// The next bytes to send; `None` when the flow is complete. A rate-limited flow
    /// first waits until its rate allows them.
    pub(super) fn next_chunk(&mut self) -> Option<&[u8]> {
        if let Some((bps, origin_ns, sent)) = self.pace {
            let due = origin_ns + (u128::from(sent) * 8 * 1_000_000_000 / u128::from(bps)) as u64;
            let now = sys::monotonic_ns();
            if due > now {
                std::thread::sleep(Duration::from_nanos(due - now));
            }
        }
        let n = match self.remaining {
            Some(left) => left.min(self.chunk.len() as u64) as usize,
            None if sys::monotonic_ns() >= self.deadline_ns => 0,
            None => self.chunk.len(),
        };
        if let Some((_, _, sent)) = &mut self.pace {
            *sent += n as u64;
        }
        if n == 0 {
            return None;
        }
        if let Some(left) = &mut self.remaining {
            *left -= n as u64;
        }
        self.payload.fill(&mut self.chunk[..n]);
        Some(&self.chunk[..n])
    }
}

/// Records the sink's receipt; an error unless it confirms every byte sent.
pub(super) fn check_receipt(receipt: &[u8; RECEIPT_LEN], report: &mut SentFlow) -> Result<()> {
    let receipt = Receipt::parse(receipt).map_err(anyhow::Error::msg)?;
    report.confirmed = receipt.bytes;
    report.verified = receipt.verified && receipt.bytes == report.bytes;
    if !report.verified {
        anyhow::bail!(
            "sink received {} of {} bytes, content {}",
            receipt.bytes,
            report.bytes,
            if receipt.verified {
                "intact"
            } else {
                "corrupt"
            }
        );
    }
    Ok(())
}
