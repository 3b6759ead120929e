//! A request/response probe: the client writes a request of a fixed size on a schedule (late
//! answers do not delay the next request: several are outstanding on a long path), the
//! echo server sends each back, and the client checks that every answer is its request and
//! records how long it took.

use super::{Payload, PayloadKind};
use crate::sys;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

/// What to probe.
#[derive(Clone, Debug)]
pub struct ProbeOptions {
    /// The echo server.
    pub to: SocketAddr,
    /// Bytes per request (and answer).
    pub size: usize,
    /// From one request's start to the next's.
    pub interval: Duration,
    /// How long to probe.
    pub seconds: f64,
    /// Seed of the request bytes.
    pub seed: u64,
}

/// The probe's record.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProbeReport {
    /// Start of the run (`CLOCK_MONOTONIC` ns).
    pub origin_ns: u64,
    /// Per request: when it was written (ns after the origin) and how long its answer took
    /// to arrive in full (ns).
    pub samples: Vec<(u64, u64)>,
    /// Every answer was its request, byte for byte.
    pub verified: bool,
    pub error: Option<String>,
}

/// Probes `options.to` until the time is up or something fails.
pub fn probe(options: &ProbeOptions) -> ProbeReport {
    let origin_ns = sys::monotonic_ns();
    let mut report = ProbeReport {
        origin_ns,
        samples: Vec::new(),
        verified: false,
        error: None,
    };
    match run(options, &mut report) {
        Ok(()) => report.verified = !report.samples.is_empty(),
        Err(e) => report.error = Some(format!("{e:#}")),
    }
    report
}

fn run(options: &ProbeOptions, report: &mut ProbeReport) -> Result<()> {
    let mut stream =
        TcpStream::connect(options.to).with_context(|| format!("connecting to {}", options.to))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut writer = stream.try_clone()?;
    // The writer keeps the schedule whatever the answers do; it tells the reader when
    // each request left.
    let (sent_at, sent) = mpsc::channel::<u64>();
    let (origin, interval) = (report.origin_ns, options.interval.as_nanos() as u64);
    let end = origin + (options.seconds * 1e9) as u64;
    let (size, seed) = (options.size, options.seed);
    let requests = std::thread::spawn(move || -> Result<()> {
        let mut payload = Payload::new(PayloadKind::Random, seed, 0);
        let mut request = vec![0u8; size];
        let mut due = origin;
        while due < end {
            let now = sys::monotonic_ns();
            if due > now {
                std::thread::sleep(Duration::from_nanos(due - now));
            }
            payload.fill(&mut request);
            if sent_at.send(sys::monotonic_ns()).is_err() {
                break;
            }
            writer.write_all(&request).context("writing a request")?;
            due += interval;
        }
        writer.shutdown(Shutdown::Write)?;
        Ok(())
    });
    let mut expected = Payload::new(PayloadKind::Random, seed, 0);
    let mut request = vec![0u8; size];
    let mut answer = vec![0u8; size];
    let mut answers = || -> Result<()> {
        for at in &sent {
            stream
                .read_exact(&mut answer)
                .context("reading an answer")?;
            let took = sys::monotonic_ns() - at;
            expected.fill(&mut request);
            if answer != request {
                bail!("answer {} differs from its request", report.samples.len());
            }
            report.samples.push((at - origin, took));
        }
        Ok(())
    };
    let read = answers();
    drop(sent);
    let written = requests
        .join()
        .map_err(|_| anyhow::anyhow!("the request thread panicked"))?;
    read.and(written)
}

/// Answers every request on one connection accepted on `listener` with the same bytes,
/// until the client closes it; returns the bytes echoed.
pub fn echo(listener: &TcpListener) -> Result<u64> {
    let (mut stream, _) = listener.accept().context("accepting")?;
    stream.set_nodelay(true)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        let n = stream.read(&mut buf).context("reading")?;
        if n == 0 {
            return Ok(total);
        }
        stream.write_all(&buf[..n]).context("echoing")?;
        total += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_checked_and_timed() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let to = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let server = std::thread::spawn(move || echo(&listener));
        let report = probe(&ProbeOptions {
            to,
            size: 1024,
            interval: Duration::from_millis(10),
            seconds: 0.2,
            seed: 3,
        });
        assert!(report.verified, "{:?}", report.error);
        assert!(
            (15..=21).contains(&report.samples.len()),
            "{}",
            report.samples.len()
        );
        let echoed = server.join().unwrap_or_else(|_| panic!("echo panicked"));
        assert_eq!(echoed.ok(), Some(1024 * report.samples.len() as u64));
        // On loopback the typical answer comes well under the interval; a thread of the
        // three held off the CPU (a shared CI machine) may delay a few, never by a second.
        let mut rtts: Vec<u64> = report.samples.iter().map(|&(_, rtt)| rtt).collect();
        rtts.sort_unstable();
        assert!(rtts[rtts.len() / 2] < 10_000_000, "{rtts:?}");
        assert!(rtts.iter().all(|&rtt| rtt < 1_000_000_000), "{rtts:?}");
    }
}
