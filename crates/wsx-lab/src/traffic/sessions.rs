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
//!
//! With [`Speak::Smb`] a session is an SMB2 client instead ([`wsx_smb::sim`]'s, against
//! [`smb_server`], the same simulation's strict server, on port 445 so that the gateways
//! run it through their SMB engine): it negotiates, sets up its session and tree, and reads
//! a file of [`SMB_FILE_LEN`] bytes (CREATE, QUERY_INFO, READs of [`SMB_READ_LEN`], CLOSE)
//! to prove itself open; held between the two, it reads a second file to prove itself again
//! (its QUERY_INFO, READ and CLOSE predicted by the gateways once they learnt the first).
//! Each file has a name of its own (`s<seed>-<n>`) and content the server derives from the
//! name, so a file must come back byte for byte as that session's; neither end may see a
//! protocol violation (an id used twice or beyond the credits granted, an unexpected
//! answer, anything after the last CLOSE's answer).

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
use wsx_smb::sim::{Client, FILE_ALL_INFORMATION, Step, framed, parties};
use wsx_smb::wire::framing::Frames;
use wsx_smb::wire::header::{Command, Messages};

/// Bytes of each request (and of its echo).
pub(crate) const REQUEST_LEN: usize = 64;

/// No single connect or echo may take longer than this.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// What the sessions speak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Speak {
    /// A request echoed byte for byte.
    #[default]
    Echo,
    /// SMB2: a file read to open the session, another to prove it again.
    Smb,
}

/// SMB sessions: the size of each file read.
pub const SMB_FILE_LEN: usize = 128 * 1024;
/// SMB sessions: the client's READ length.
pub const SMB_READ_LEN: u32 = 64 * 1024;

/// What the client opens.
#[derive(Clone, Debug)]
pub struct SessionsOptions {
    /// The servers; sessions are spread over them in turn.
    pub to: Vec<SocketAddr>,
    /// What the sessions speak.
    pub speak: Speak,
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
                    match probe_one(to, seed, options.speak).await {
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

/// A held session: its stream, its seed, and for SMB its client.
type Held = (TcpStream, u64, Option<Box<SmbSession>>);

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
        let speak = options.speak;
        tasks.spawn(async move {
            let opened = open_one(to, seed, speak).await;
            drop(permit);
            opened.map(|(stream, smb, times)| ((stream, seed, smb), times))
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

/// Connects to `to` and proves the session: one request echoed, or an SMB file read.
async fn open_one(
    to: SocketAddr,
    seed: u64,
    speak: Speak,
) -> Result<(TcpStream, Option<Box<SmbSession>>, SessionTimes)> {
    let start = sys::monotonic_ns();
    let mut stream = tokio::time::timeout(STEP_TIMEOUT, TcpStream::connect(to))
        .await
        .context("connect timed out")?
        .context("connect")?;
    let connected_ns = sys::monotonic_ns() - start;
    stream.set_nodelay(true)?;
    let smb = match speak {
        Speak::Echo => {
            echo_once(&mut stream, seed, 0).await?;
            None
        }
        Speak::Smb => {
            let mut smb = Box::new(SmbSession::new(seed));
            smb.read_file(&mut stream).await?;
            Some(smb)
        }
    };
    let first_echo_ns = sys::monotonic_ns() - start;
    Ok((
        stream,
        smb,
        SessionTimes {
            connected_ns,
            first_echo_ns,
            second_echo_ns: 0,
        },
    ))
}

/// Proves an open session again: a second request echoed, or a second file read.
async fn prove_again(
    stream: &mut TcpStream,
    seed: u64,
    smb: Option<&mut SmbSession>,
) -> Result<()> {
    match smb {
        None => echo_once(stream, seed, 1).await,
        Some(smb) => smb.read_file(stream).await,
    }
}

/// Closes a proved session: for SMB, nothing may come after the last CLOSE's answer (the
/// server closes its end at the client's).
async fn close(mut stream: TcpStream, smb: Option<&SmbSession>) -> Result<()> {
    stream.shutdown().await.context("close")?;
    if smb.is_some() {
        let mut rest = Vec::new();
        tokio::time::timeout(STEP_TIMEOUT, stream.read_to_end(&mut rest))
            .await
            .context("the server did not close")?
            .context("reading to the end")?;
        anyhow::ensure!(
            rest.is_empty(),
            "SMB: {} bytes after the last CLOSE's answer",
            rest.len()
        );
    }
    Ok(())
}

/// Opens a session, proves it twice (the first opens the way through the gateways, the
/// second finds it open) and closes it. In a task of its own: a panic of the simulated
/// client on a bad answer fails this probe, not the process.
async fn probe_one(to: SocketAddr, seed: u64, speak: Speak) -> Result<SessionTimes> {
    tokio::spawn(async move {
        let start = sys::monotonic_ns();
        let (mut stream, mut smb, mut times) = open_one(to, seed, speak).await?;
        prove_again(&mut stream, seed, smb.as_deref_mut()).await?;
        times.second_echo_ns = sys::monotonic_ns() - start;
        close(stream, smb.as_deref()).await?;
        Ok(times)
    })
    .await?
}

/// An SMB session's client: [`wsx_smb::sim::Client`] reading two files, one at each proof.
#[derive(Debug)]
pub(crate) struct SmbSession {
    client: Client,
    frames: Frames,
    /// The next request, once the client has one: the first, then the second file's
    /// CREATE while the session is held.
    next: Option<Vec<u8>>,
    start: std::time::Instant,
}

impl SmbSession {
    fn new(seed: u64) -> Self {
        let (mut client, _) = parties(0, SMB_READ_LEN);
        client.files = 2;
        client.queries = vec![FILE_ALL_INFORMATION];
        client.names = vec![format!("s{seed}-1"), format!("s{seed}-2")];
        let next = Some(client.start());
        Self {
            client,
            frames: Frames::new(),
            next,
            start: std::time::Instant::now(),
        }
    }

    /// Runs the client until it has read one more file and closed it: checks every byte,
    /// and that the server's answers broke no rule the client checks.
    async fn read_file(&mut self, stream: &mut TcpStream) -> Result<()> {
        let files = self.client.opened + 1;
        let mut buf = vec![0u8; 64 * 1024];
        tokio::time::timeout(STEP_TIMEOUT, async {
            loop {
                if let Some(request) = self.next.take() {
                    stream.write_all(&framed(&request)).await.context("write")?;
                }
                let n = stream.read(&mut buf).await.context("read")?;
                anyhow::ensure!(n > 0, "the server closed the session");
                let mut frames = Vec::new();
                self.frames
                    .feed(&buf[..n], |kind| kind == 0, |_, frame| frames.push(frame))
                    .map_err(|_| anyhow::anyhow!("not an SMB session message"))?;
                for frame in frames {
                    let now = self.start.elapsed().as_micros() as u64;
                    self.next = self.client.answered(&frame, now);
                    if let Some(violation) = self.client.violations.first() {
                        anyhow::bail!("SMB: {violation}");
                    }
                }
                let closed = match self.client.step {
                    Step::Done => true,
                    Step::Create => self.client.opened == files,
                    _ => false,
                };
                if closed {
                    return anyhow::Ok(());
                }
            }
        })
        .await
        .context("SMB file read timed out")??;
        let name = &self.client.names[files - 1];
        anyhow::ensure!(
            smb_content(name).is_some_and(|file| self.client.data == file),
            "SMB file {name} differs from the server's ({} bytes read)",
            self.client.data.len()
        );
        self.client.data = Vec::new();
        Ok(())
    }
}

/// What the lab's SMB server serves under `name` (`s<seed>-<n>`): [`SMB_FILE_LEN`]
/// pseudo-random bytes of that seed and number; `None` for another name.
fn smb_content(name: &str) -> Option<Vec<u8>> {
    let (seed, n) = name.strip_prefix('s')?.split_once('-')?;
    let mut file = vec![0u8; SMB_FILE_LEN];
    Payload::new(PayloadKind::Random, seed.parse().ok()?, n.parse().ok()?).fill(&mut file);
    Some(file)
}

/// The name a CREATE request opens (UTF-16LE at its NameOffset, from the header's start).
fn created_name(message: &[u8]) -> Option<String> {
    let body = message.get(wsx_smb::wire::header::HEADER_LEN..)?;
    let at = usize::from(u16::from_le_bytes([*body.get(44)?, *body.get(45)?]));
    let len = usize::from(u16::from_le_bytes([*body.get(46)?, *body.get(47)?]));
    let units: Vec<u16> = message
        .get(at..at + len)?
        .chunks_exact(2)
        .map(|pair| u16::from_le_bytes([pair[0], pair[1]]))
        .collect();
    String::from_utf16(&units).ok()
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
    for (mut stream, seed, mut smb) in held {
        let Ok(permit) = gate.clone().acquire_owned().await else {
            break;
        };
        tasks.spawn(async move {
            let proved = prove_again(&mut stream, seed, smb.as_deref_mut()).await;
            let closed = match proved {
                Ok(()) => close(stream, smb.as_deref()).await,
                Err(e) => Err(e),
            };
            drop(permit);
            closed
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

/// Serves SMB2 on every connection accepted at `listen` (with `SO_REUSEPORT`, so that
/// several processes may share one address): each gets its own
/// [`wsx_smb::sim::Server`], which answers as strictly as the engine simulations', and
/// each file a session opens holds what its name says ([`SMB_FILE_LEN`] bytes); a request
/// that breaks the server's rules (an id used twice, beyond the credits granted, on a file
/// not open) ends the connection. `ready` is called once listening.
pub fn smb_server(listen: SocketAddr, ready: impl FnOnce(SocketAddr)) -> Result<()> {
    sys::raise_open_file_limit();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let socket = match listen {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        socket.set_reuseport(true)?;
        socket
            .bind(listen)
            .with_context(|| format!("binding {listen}"))?;
        let listener = socket.listen(4096)?;
        ready(listener.local_addr()?);
        serve_smb(listener).await
    })
}

async fn serve_smb(listener: TcpListener) -> Result<()> {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(smb_connection(stream));
            }
            // Out of descriptors or similar: wait instead of spinning.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

async fn smb_connection(stream: TcpStream) {
    answer_smb(stream, |_| {}).await;
}

/// Answers SMB2 on `stream` with a fresh simulated server, each answer passed through
/// `alter` first (a test's way to break one).
async fn answer_smb(mut stream: TcpStream, alter: impl Fn(&mut Vec<u8>)) {
    let _ = stream.set_nodelay(true);
    let (_, mut server) = parties(0, SMB_READ_LEN);
    let mut frames = Frames::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut requests = Vec::new();
        if frames
            .feed(&buf[..n], |kind| kind == 0, |_, frame| requests.push(frame))
            .is_err()
        {
            return;
        }
        let mut out = Vec::new();
        for request in requests {
            // One file open at a time: a CREATE names what the READs that follow read.
            let opened = Messages::new(&request)
                .find(|(h, _)| h.command == Command::CREATE)
                .and_then(|(_, message)| created_name(message))
                .and_then(|name| smb_content(&name));
            if let Some(file) = opened {
                server.file = file;
            }
            for mut answer in server.answer(&request) {
                alter(&mut answer);
                out.extend_from_slice(&framed(&answer));
            }
        }
        if let Some(violation) = server.violations.first() {
            eprintln!("smb-server: {violation}; ending the connection");
            return;
        }
        if stream.write_all(&out).await.is_err() {
            return;
        }
    }
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

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    async fn loopback() -> (TcpListener, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let to = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        (listener, to)
    }

    /// Opens `count` sessions speaking `speak` to `to`, four at a time, lets `check` see
    /// them held, then proves and closes them all.
    async fn open_hold_close(
        to: SocketAddr,
        speak: Speak,
        count: usize,
        check: impl FnOnce(&[Held]),
    ) -> SessionsReport {
        let options = SessionsOptions {
            to: vec![to],
            speak,
            count,
            concurrency: 4,
            seed: 5,
        };
        let mut report = SessionsReport {
            count,
            ..SessionsReport::default()
        };
        let held = open_all(&options, &mut report).await;
        report.opened = held.len();
        check(&held);
        close_all(held, &options, &mut report).await;
        report
    }

    /// Sessions opened against a loopback echo server are all echoed twice.
    #[test]
    fn sessions_open_hold_and_close_verified() {
        let report = runtime().block_on(async {
            let (listener, to) = loopback().await;
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(echo_connection(stream));
                }
            });
            open_hold_close(to, Speak::Echo, 50, |_| {}).await
        });
        assert!(report.verified(), "{report:?}");
        assert_eq!(report.opening.len(), 50);
        assert!(report.open_end_ns >= report.open_start_ns);
    }

    /// SMB sessions against the simulated server: each reads its first file to open, is
    /// held, and reads its second to prove itself again; a probe does both in a row.
    #[test]
    fn smb_sessions_read_both_files_byte_for_byte() {
        let (report, probe) = runtime().block_on(async {
            let (listener, to) = loopback().await;
            tokio::spawn(serve_smb(listener));
            let report = open_hold_close(to, Speak::Smb, 20, |held| {
                let one_file_read = |smb: &Option<Box<SmbSession>>| {
                    smb.as_ref().is_some_and(|s| s.client.opened == 1)
                };
                assert!(held.iter().all(|(_, _, smb)| one_file_read(smb)));
            })
            .await;
            (report, probe_one(to, 9, Speak::Smb).await)
        });
        assert!(report.verified(), "{report:?}");
        let probe = probe.unwrap_or_else(|e| panic!("{e:#}"));
        assert!(probe.second_echo_ns > probe.first_echo_ns);
    }

    /// A server that answers a READ with other bytes fails the session.
    #[test]
    fn an_smb_file_read_wrong_is_an_error() {
        let result = runtime().block_on(async {
            let (listener, to) = loopback().await;
            tokio::spawn(async move {
                // The simulated server, but every READ answer's last byte flipped.
                if let Ok((stream, _)) = listener.accept().await {
                    answer_smb(stream, |answer| {
                        if answer[12] == 8
                            && let Some(last) = answer.last_mut()
                        {
                            *last ^= 1;
                        }
                    })
                    .await;
                }
            });
            open_one(to, 1, Speak::Smb).await.map(|_| ())
        });
        let error = result.err().map(|e| format!("{e:#}"));
        assert_eq!(
            error.as_deref(),
            Some("SMB file s1-1 differs from the server's (131072 bytes read)")
        );
    }

    /// An echo that is not the request is a failure, not a session.
    #[test]
    fn a_wrong_echo_is_counted_as_an_error() {
        let result = runtime().block_on(async {
            let (listener, to) = loopback().await;
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
            open_one(to, 1, Speak::Echo).await.map(|_| ())
        });
        let error = result.err().map(|e| format!("{e:#}"));
        assert_eq!(error.as_deref(), Some("echo differs from the request"));
    }
}
