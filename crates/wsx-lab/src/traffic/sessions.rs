//! Many concurrent sessions: a client that opens `count` connections (at most `concurrency`
//! connecting at once), proves each with an echoed request, holds them all until told, then
//! proves each again and closes it; and an echo server for any number of connections.
//!
//! The client is driven by lines on its standard input, so that a benchmark can measure
//! the gateways while every session is held:
//!
//! 1. it opens its sessions and prints `opened`;
//! 2. on `probe N` it times N fresh sessions one after the other (connect, one echoed
//!    request, close) beside the held ones, and prints `probed`;
//! 3. on `close` (or end of input) it sends a second request on every held session,
//!    checks its echo, closes them and writes its report.
//!
//! Every request is pseudo-random bytes of the session's own seed; an echo counts only when
//! it is the request, byte for byte.

use super::{Payload, PayloadKind};
use crate::sys;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Bytes of each request (and of its echo).
pub(crate) const REQUEST_LEN: usize = 64;

/// No single connect or echo may take longer than this.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// What the client opens.
#[derive(Clone, Debug)]
pub struct SessionsOptions {
    /// The echo servers; sessions are spread over them in turn.
    pub to: Vec<SocketAddr>,
    /// Sessions to open and hold.
    pub count: usize,
    /// Connections being opened at once.
    pub concurrency: usize,
    /// Seed of the requests; session `i` uses `seed + i`.
    pub seed: u64,
}

/// One session's times, in nanoseconds from the start of its connect.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct SessionTimes {
    /// The connect call returned.
    pub connected_ns: u64,
    /// The echo of the first request arrived in full.
    pub first_echo_ns: u64,
    /// Probes only: a second request's echo arrived in full (on the open session).
    #[serde(default)]
    pub second_echo_ns: u64,
}

/// The client's record.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SessionsReport {
    /// Sessions asked for, and how many were opened and echoed.
    pub count: usize,
    pub opened: usize,
    /// `CLOCK_MONOTONIC` ns when the first connect started and the last first echo arrived.
    pub open_start_ns: u64,
    pub open_end_ns: u64,
    /// Times of the sessions opened at once (in the order they finished).
    pub opening: Vec<SessionTimes>,
    /// Times of the probe sessions, opened one at a time while the others were held.
    pub probes: Vec<SessionTimes>,
    /// Held sessions whose second request was echoed after the hold.
    pub held_verified: usize,
    /// Failures by message (connect refused, timeouts, wrong echo...), counted.
    pub errors: BTreeMap<String, usize>,
}

impl SessionsReport {
    /// Every session opened, every probe and every held session echoed its requests.
    pub fn verified(&self) -> bool {
        self.errors.is_empty() && self.opened == self.count && self.held_verified == self.count
    }

    fn fail(&mut self, e: &anyhow::Error) {
        *self.errors.entry(format!("{e:#}")).or_default() += 1;
    }
}

/// Runs the client with commands from standard input and writes `opened` and `probed` to
/// standard output; returns the report.
pub fn sessions(options: &SessionsOptions) -> Result<SessionsReport> {
    sys::raise_open_file_limit();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(drive(options))
}

async fn drive(options: &SessionsOptions) -> Result<SessionsReport> {
    anyhow::ensure!(!options.to.is_empty(), "no echo server to open sessions to");
    let mut report = SessionsReport {
        count: options.count,
        ..SessionsReport::default()
    };
    let held = open_all(options, &mut report).await;
    report.opened = held.len();
    say("opened")?;
    // Commands come from a blocking reader thread.
    let (commands_tx, mut commands) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if commands_tx.send(line).is_err() {
                break;
            }
        }
    });
    let probe_seed = options.seed.wrapping_add(options.count as u64);
    while let Some(line) = commands.recv().await {
        let mut words = line.split_whitespace();
        match (words.next(), words.next().map(str::parse::<usize>)) {
            (Some("probe"), Some(Ok(n))) => {
                for i in 0..n {
                    let to = options.to[i % options.to.len()];
                    let seed = probe_seed.wrapping_add(i as u64);
                    match probe_one(to, seed).await {
                        Ok(times) => report.probes.push(times),
                        Err(e) => report.fail(&e),
                    }
                }
                say("probed")?;
            }
            (Some("close"), _) => break,
            _ => anyhow::bail!("unknown command {line:?} (probe N, close)"),
        }
    }
    close_all(held, options, &mut report).await;
    Ok(report)
}

fn say(line: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// A held session: its stream and its seed.
type Held = (TcpStream, u64);

/// Opens `options.count` sessions, `options.concurrency` at a time.
async fn open_all(options: &SessionsOptions, report: &mut SessionsReport) -> Vec<Held> {
    let gate = Arc::new(Semaphore::new(options.concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    report.open_start_ns = sys::monotonic_ns();
    for i in 0..options.count {
        let Ok(permit) = gate.clone().acquire_owned().await else {
            break;
        };
        let to = options.to[i % options.to.len()];
        let seed = options.seed.wrapping_add(i as u64);
        tasks.spawn(async move {
            let opened = open_one(to, seed).await;
            drop(permit);
            opened.map(|(stream, times)| ((stream, seed), times))
        });
    }
    let mut held = Vec::with_capacity(options.count);
    while let Some(done) = tasks.join_next().await {
        match done.map_err(anyhow::Error::from).and_then(|r| r) {
            Ok((session, times)) => {
                held.push(session);
                report.opening.push(times);
            }
            Err(e) => report.fail(&e),
        }
    }
    report.open_end_ns = sys::monotonic_ns();
    held
}

/// Connects to `to` and has one request echoed.
async fn open_one(to: SocketAddr, seed: u64) -> Result<(TcpStream, SessionTimes)> {
    let start = sys::monotonic_ns();
    let mut stream = tokio::time::timeout(STEP_TIMEOUT, TcpStream::connect(to))
        .await
        .context("connect timed out")?
        .context("connect")?;
    let connected_ns = sys::monotonic_ns() - start;
    stream.set_nodelay(true)?;
    echo_once(&mut stream, seed, 0).await?;
    let first_echo_ns = sys::monotonic_ns() - start;
    Ok((
        stream,
        SessionTimes {
            connected_ns,
            first_echo_ns,
            second_echo_ns: 0,
        },
    ))
}

/// Opens a session, has two requests echoed (the first opens the way through the
/// gateways, the second finds it open) and closes it.
async fn probe_one(to: SocketAddr, seed: u64) -> Result<SessionTimes> {
    let start = sys::monotonic_ns();
    let (mut stream, mut times) = open_one(to, seed).await?;
    echo_once(&mut stream, seed, 1).await?;
    times.second_echo_ns = sys::monotonic_ns() - start;
    stream.shutdown().await.context("close")?;
    Ok(times)
}

/// Sends request number `n` of the session seeded `seed` and checks its echo.
async fn echo_once(stream: &mut TcpStream, seed: u64, n: u16) -> Result<()> {
    let mut request = [0u8; REQUEST_LEN];
    Payload::new(PayloadKind::Random, seed, n).fill(&mut request);
    let mut answer = [0u8; REQUEST_LEN];
    tokio::time::timeout(STEP_TIMEOUT, async {
        stream.write_all(&request).await.context("write")?;
        stream.read_exact(&mut answer).await.context("read")?;
        anyhow::Ok(())
    })
    .await
    .context("echo timed out")??;
    anyhow::ensure!(answer == request, "echo differs from the request");
    Ok(())
}

/// Proves every held session with a second request, then closes it.
async fn close_all(held: Vec<Held>, options: &SessionsOptions, report: &mut SessionsReport) {
    let gate = Arc::new(Semaphore::new(options.concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for (mut stream, seed) in held {
        let Ok(permit) = gate.clone().acquire_owned().await else {
            break;
        };
        tasks.spawn(async move {
            let proved = echo_once(&mut stream, seed, 1).await;
            let closed = stream.shutdown().await.context("close");
            drop(permit);
            proved.and(closed)
        });
    }
    while let Some(done) = tasks.join_next().await {
        match done.map_err(anyhow::Error::from).and_then(|r| r) {
            Ok(()) => report.held_verified += 1,
            Err(e) => report.fail(&e),
        }
    }
}

/// Echoes every connection accepted on `listener` until its client closes it; `ready` is
/// called once listening.
pub fn echo_server(listen: SocketAddr, ready: impl FnOnce(SocketAddr)) -> Result<()> {
    sys::raise_open_file_limit();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        ready(listener.local_addr()?);
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(echo_connection(stream));
                }
                // Out of descriptors or similar: wait instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    })
}

async fn echo_connection(mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut buf = [0u8; 2048];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if stream.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sessions opened against a loopback echo server are all echoed twice.
    #[test]
    fn sessions_open_hold_and_close_verified() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let report = runtime.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let to = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(echo_connection(stream));
                }
            });
            let options = SessionsOptions {
                to: vec![to],
                count: 50,
                concurrency: 8,
                seed: 5,
            };
            let mut report = SessionsReport {
                count: 50,
                ..SessionsReport::default()
            };
            let held = open_all(&options, &mut report).await;
            report.opened = held.len();
            close_all(held, &options, &mut report).await;
            report
        });
        assert!(report.verified(), "{report:?}");
        assert_eq!(report.opening.len(), 50);
        assert!(report.open_end_ns >= report.open_start_ns);
    }

    /// An echo that is not the request is a failure, not a session.
    #[test]
    fn a_wrong_echo_is_counted_as_an_error() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let result = runtime.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let to = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
            tokio::spawn(async move {
                // Answers with the right length and the wrong bytes.
                if let Ok((mut stream, _)) = listener.accept().await {
                    let mut buf = [0u8; REQUEST_LEN];
                    if stream.read_exact(&mut buf).await.is_ok() {
                        buf[7] ^= 1;
                        let _ = stream.write_all(&buf).await;
                    }
                }
            });
            open_one(to, 1).await
        });
        let error = result.err().map(|e| format!("{e:#}"));
        assert_eq!(error.as_deref(), Some("echo differs from the request"));
    }
}
