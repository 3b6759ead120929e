//! Request/response exchanges with one request outstanding, as a file client that keeps one
//! READ in flight: the client asks for an answer of a given size, waits for all of it, checks
//! it and asks again. Each exchange is timed from the request's write to the answer's last
//! byte, so the figure is what the application waits: one round trip and the answer's time
//! on the path, at best.
//!
//! A request is [`REQUEST_LEN`] bytes: magic `WSXQ`, the exchange's number and the answer's
//! length (big-endian `u32`s), then the run's seed (`u64`) and zeros. The server answers with
//! that many bytes of the random [`Payload`] stream seeded by the run's seed and the
//! exchange's number, so the client checks every byte without either side storing a file.

use super::{Payload, PayloadKind};
use crate::sys;
use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Bytes of a request.
pub(super) const REQUEST_LEN: usize = 32;
const MAGIC_REQUEST: [u8; 4] = *b"WSXQ";
/// The largest answer a server gives (a request for more is refused: a corrupt request must
/// not make the server allocate without bound).
pub(super) const MAX_ANSWER: usize = 64 << 20;

/// What to ask.
#[derive(Clone, Debug)]
pub struct ExchangeOptions {
    /// The answering server.
    pub to: SocketAddr,
    /// Exchanges, one after another on one connection.
    pub exchanges: usize,
    /// Bytes of each answer.
    pub answer_len: usize,
    /// TCP congestion control of the client's socket (`TCP_CONGESTION`); `None` keeps the
    /// namespace's.
    pub congestion: Option<String>,
    /// Seed of the answers.
    pub seed: u64,
    /// The longest one exchange may take before the run fails.
    pub timeout: Duration,
}

/// The client's record of a run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ExchangeReport {
    /// From the start of `connect` to the connection's establishment, ns.
    pub connect_ns: u64,
    /// Each exchange's time from the request's write to the answer's last byte, ns.
    pub exchanges_ns: Vec<u64>,
    /// Answer bytes received and checked.
    pub bytes: u64,
    /// Every exchange asked for completed and every answer matched, byte for byte.
    pub verified: bool,
    pub error: Option<String>,
    /// CPU seconds of the client process.
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
}

/// A request as the server reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Request {
    index: u32,
    answer_len: u32,
    seed: u64,
}

impl Request {
    fn emit(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&MAGIC_REQUEST);
        b[4..8].copy_from_slice(&self.index.to_be_bytes());
        b[8..12].copy_from_slice(&self.answer_len.to_be_bytes());
        b[12..20].copy_from_slice(&self.seed.to_be_bytes());
        b
    }

    fn parse(b: &[u8; REQUEST_LEN]) -> Result<Self> {
        ensure!(
            b[0..4] == MAGIC_REQUEST,
            "not a wsx-lab request (magic {:02x?})",
            &b[0..4]
        );
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut seed = [0u8; 8];
        seed.copy_from_slice(&b[12..20]);
        let request = Self {
            index: u32_at(4),
            answer_len: u32_at(8),
            seed: u64::from_be_bytes(seed),
        };
        ensure!(
            request.answer_len as usize <= MAX_ANSWER,
            "request {} asks for {} bytes, more than {MAX_ANSWER}",
            request.index,
            request.answer_len
        );
        Ok(request)
    }

    /// The answer's bytes.
    fn fill(&self, answer: &mut [u8]) {
        let seed = self.seed ^ u64::from(self.index).wrapping_mul(0xd605_bbb5_8c8a_be63);
        Payload::new(PayloadKind::Random, seed, 0).fill(answer);
    }
}

/// Runs `options.exchanges` exchanges against `options.to`; stops at the first failure.
pub fn exchange(options: &ExchangeOptions) -> ExchangeReport {
    let mut report = ExchangeReport {
        connect_ns: 0,
        exchanges_ns: Vec::with_capacity(options.exchanges),
        bytes: 0,
        verified: false,
        error: None,
        cpu_user_s: 0.0,
        cpu_sys_s: 0.0,
    };
    match run(options, &mut report) {
        Ok(()) => report.verified = report.exchanges_ns.len() == options.exchanges,
        Err(e) => report.error = Some(format!("{e:#}")),
    }
    let usage = sys::process_usage();
    report.cpu_user_s = usage.user_s;
    report.cpu_sys_s = usage.sys_s;
    report
}

fn run(options: &ExchangeOptions, report: &mut ExchangeReport) -> Result<()> {
    let answer_len = u32::try_from(options.answer_len)
        .ok()
        .filter(|&n| n as usize <= MAX_ANSWER)
        .with_context(|| format!("answers of {} bytes are too long", options.answer_len))?;
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(options.to),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    if let Some(cc) = &options.congestion {
        sys::set_tcp_congestion(socket.as_raw_fd(), cc)
            .with_context(|| format!("setting TCP_CONGESTION {cc}"))?;
    }
    let started = sys::monotonic_ns();
    socket
        .connect(&options.to.into())
        .with_context(|| format!("connecting to {}", options.to))?;
    report.connect_ns = sys::monotonic_ns() - started;
    let mut stream: TcpStream = socket.into();
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(options.timeout))?;
    stream.set_write_timeout(Some(options.timeout))?;
    let mut expected = vec![0u8; options.answer_len];
    let mut answer = vec![0u8; options.answer_len];
    for index in 0..options.exchanges {
        let request = Request {
            index: u32::try_from(index).context("too many exchanges")?,
            answer_len,
            seed: options.seed,
        };
        // The expected answer is made before the clock starts.
        request.fill(&mut expected);
        let asked = sys::monotonic_ns();
        stream
            .write_all(&request.emit())
            .with_context(|| format!("writing request {index}"))?;
        stream
            .read_exact(&mut answer)
            .with_context(|| format!("reading answer {index}"))?;
        report.exchanges_ns.push(sys::monotonic_ns() - asked);
        if answer != expected {
            bail!("answer {index} differs from what was asked for");
        }
        report.bytes += answer.len() as u64;
    }
    Ok(())
}

/// What the server did on its connection.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AnswerReport {
    pub exchanges: u64,
    pub bytes: u64,
}

/// Answers every request on one connection accepted on `listener` until the client closes
/// it. `congestion` is set on the accepted socket before it sends anything.
pub fn answer(listener: &TcpListener, congestion: Option<&str>) -> Result<AnswerReport> {
    let (mut stream, _) = listener.accept().context("accepting")?;
    if let Some(cc) = congestion {
        sys::set_tcp_congestion(stream.as_raw_fd(), cc)
            .with_context(|| format!("setting TCP_CONGESTION {cc}"))?;
    }
    stream.set_nodelay(true)?;
    let mut report = AnswerReport {
        exchanges: 0,
        bytes: 0,
    };
    let mut request = [0u8; REQUEST_LEN];
    let mut answer = Vec::new();
    loop {
        match stream.read_exact(&mut request) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(report),
            Err(e) => return Err(e).context("reading a request"),
        }
        let request = Request::parse(&request)?;
        answer.resize(request.answer_len as usize, 0);
        request.fill(&mut answer);
        stream
            .write_all(&answer)
            .with_context(|| format!("answering request {}", request.index))?;
        report.exchanges += 1;
        report.bytes += answer.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reads_back_as_written() {
        let request = Request {
            index: 7,
            answer_len: 65536,
            seed: 0x0123_4567_89ab_cdef,
        };
        assert_eq!(Request::parse(&request.emit()).ok(), Some(request));
        let mut bad = request.emit();
        bad[0] = b'X';
        assert!(Request::parse(&bad).is_err());
        let huge = Request {
            answer_len: MAX_ANSWER as u32 + 1,
            ..request
        };
        assert!(Request::parse(&huge.emit()).is_err());
    }

    #[test]
    fn answers_differ_between_exchanges() {
        let request = |index| Request {
            index,
            answer_len: 64,
            seed: 1,
        };
        let (mut a, mut b) = ([0u8; 64], [0u8; 64]);
        request(0).fill(&mut a);
        request(1).fill(&mut b);
        assert_ne!(a, b);
    }

    #[test]
    fn exchanges_are_checked_and_timed() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let to = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let server = std::thread::spawn(move || answer(&listener, None));
        let report = exchange(&ExchangeOptions {
            to,
            exchanges: 20,
            answer_len: 100_000,
            congestion: None,
            seed: 5,
            timeout: Duration::from_secs(10),
        });
        assert!(report.verified, "{:?}", report.error);
        assert_eq!(report.exchanges_ns.len(), 20);
        assert_eq!(report.bytes, 2_000_000);
        assert!(report.exchanges_ns.iter().all(|&ns| ns > 0));
        let served = server
            .join()
            .unwrap_or_else(|_| panic!("server panicked"))
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!((served.exchanges, served.bytes), (20, 2_000_000));
    }

    #[test]
    fn a_wrong_answer_fails_the_run() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let to = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        // A server that answers with the right length and the wrong bytes.
        let server = std::thread::spawn(move || -> std::io::Result<()> {
            let (mut stream, _) = listener.accept()?;
            let mut request = [0u8; REQUEST_LEN];
            stream.read_exact(&mut request)?;
            stream.write_all(&[0u8; 1000])
        });
        let report = exchange(&ExchangeOptions {
            to,
            exchanges: 3,
            answer_len: 1000,
            congestion: None,
            seed: 5,
            timeout: Duration::from_secs(10),
        });
        assert!(!report.verified);
        assert!(
            report
                .error
                .as_deref()
                .is_some_and(|e| e.contains("answer 0 differs")),
            "{:?}",
            report.error
        );
        let _ = server.join();
    }
}
