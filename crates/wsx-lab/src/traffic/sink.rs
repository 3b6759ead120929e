//! The receiving side.

use super::{BUCKET_NS, HEADER_LEN, Header, Payload, Receipt};
use crate::sys;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// How the sink runs.
#[derive(Clone, Copy, Debug)]
pub struct SinkOptions {
    /// Connections to accept before reporting.
    pub flows: u16,
    /// A connection idle this long fails, and so does a wait this long for the next
    /// connection (a sender that never connects must not hold the sink for ever).
    pub idle_timeout: Duration,
}

/// What the sink received.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SinkReport {
    /// One entry per flow, in flow-number order.
    pub flows: Vec<FlowReport>,
    /// User CPU seconds of the sink process.
    pub cpu_user_s: f64,
    /// System CPU seconds of the sink process.
    pub cpu_sys_s: f64,
    /// The tunnel's side of the run, when the flows were tunnel streams.
    #[serde(default)]
    pub tunnel: Option<super::TunnelReport>,
}

impl SinkReport {
    /// Every flow arrived whole and every byte matched.
    pub fn verified(&self) -> bool {
        !self.flows.is_empty() && self.flows.iter().all(|f| f.verified)
    }
}

/// One flow, from the sink's side.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct FlowReport {
    /// Flow number.
    pub flow: u16,
    /// Payload bytes received.
    pub bytes: u64,
    /// The sender's origin time.
    pub origin_ns: u64,
    /// When the first payload byte arrived.
    pub first_byte_ns: u64,
    /// When the last payload byte arrived.
    pub last_byte_ns: u64,
    /// Payload bytes received in each 100 ms since the origin.
    pub buckets: Vec<u64>,
    /// Every byte matched the expected stream, and the count matched the header's if it had one.
    pub verified: bool,
    /// What went wrong, if anything.
    pub error: Option<String>,
}

/// Accepts `options.flows` connections on `listener`, verifies them all, and reports.
pub fn sink(listener: &TcpListener, options: SinkOptions) -> Result<SinkReport> {
    // SO_RCVTIMEO bounds accept(2) as it bounds reads.
    socket2::SockRef::from(listener).set_read_timeout(Some(options.idle_timeout))?;
    let mut handles = Vec::new();
    for accepted in 0..options.flows {
        let (stream, _) = listener.accept().with_context(|| {
            format!(
                "accepting flow {} of {} (waited up to {:?})",
                accepted + 1,
                options.flows,
                options.idle_timeout
            )
        })?;
        handles.push(
            std::thread::Builder::new()
                .name("sink".into())
                .spawn(move || receive(stream, options))?,
        );
    }
    let mut flows: Vec<FlowReport> = handles
        .into_iter()
        .map(|h| {
            h.join().unwrap_or_else(|_| FlowReport {
                error: Some("sink thread panicked".into()),
                ..Default::default()
            })
        })
        .collect();
    flows.sort_by_key(|f| f.flow);
    let usage = sys::process_usage();
    Ok(SinkReport {
        flows,
        cpu_user_s: usage.user_s,
        cpu_sys_s: usage.sys_s,
        tunnel: None,
    })
}

fn receive(mut stream: TcpStream, options: SinkOptions) -> FlowReport {
    let mut report = FlowReport::default();
    match try_receive(&mut stream, options, &mut report) {
        Ok(()) => report.verified = true,
        Err(e) => report.error = Some(format!("{e:#}")),
    }
    let receipt = Receipt {
        verified: report.verified,
        bytes: report.bytes,
    };
    let _ = stream.write_all(&receipt.emit());
    report
}

fn try_receive(
    stream: &mut TcpStream,
    options: SinkOptions,
    report: &mut FlowReport,
) -> Result<()> {
    stream.set_read_timeout(Some(options.idle_timeout))?;
    let mut header = [0u8; HEADER_LEN];
    stream
        .read_exact(&mut header)
        .context("reading the stream header")?;
    let mut check = Check::new(&header, report)?;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context(format!("reading after {} bytes", report.bytes)),
        };
        check.data(&buf[..n], report)?;
    }
    check.end(report)
}

/// Checks a flow's bytes against the stream its header names, and counts them.
pub(super) struct Check {
    header: Header,
    expected_stream: Payload,
    expected: Vec<u8>,
}

impl Check {
    /// Starts checking the flow that `header` opened.
    pub(super) fn new(header: &[u8; HEADER_LEN], report: &mut FlowReport) -> Result<Self> {
        let header = Header::parse(header).map_err(anyhow::Error::msg)?;
        report.flow = header.flow;
        report.origin_ns = header.origin_ns;
        Ok(Self {
            expected_stream: Payload::new(header.kind, header.seed, header.flow),
            header,
            expected: Vec::new(),
        })
    }

    /// The next bytes of the flow, as they arrived.
    pub(super) fn data(&mut self, data: &[u8], report: &mut FlowReport) -> Result<()> {
        let now = sys::monotonic_ns();
        if report.bytes == 0 {
            report.first_byte_ns = now;
        }
        report.last_byte_ns = now;
        self.expected.resize(data.len(), 0);
        self.expected_stream.fill(&mut self.expected);
        if data != self.expected.as_slice() {
            let at = data
                .iter()
                .zip(&self.expected)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            anyhow::bail!(
                "byte {} differs from the expected stream",
                report.bytes + at as u64
            );
        }
        report.bytes += data.len() as u64;
        let bucket = (now.saturating_sub(self.header.origin_ns) / BUCKET_NS) as usize;
        if bucket >= report.buckets.len() {
            report.buckets.resize(bucket + 1, 0);
        }
        report.buckets[bucket] += data.len() as u64;
        Ok(())
    }

    /// The sender finished: the count must match the header's, if it gave one.
    pub(super) fn end(&self, report: &FlowReport) -> Result<()> {
        if self.header.total_bytes != 0 && report.bytes != self.header.total_bytes {
            anyhow::bail!(
                "stream ended after {} of {} bytes",
                report.bytes,
                self.header.total_bytes
            );
        }
        Ok(())
    }
}
