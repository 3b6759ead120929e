//! `cargo xtask soak`: the gateways under mixed traffic for a long run while things go
//! wrong, with their memory and descriptors sampled throughout.
//!
//! Through the intercepting gateway pair, until the time is up:
//!
//! - bulk workers each send one verified transfer after another (`wsx-lab send` and
//!   `sink`, one flow of [`BULK_BYTES`], hashed end to end);
//! - a sessions worker opens [`SESSIONS`] short sessions at a time to an echo server,
//!   proves each with two echoed requests and closes them, again and again.
//!
//! Every cycle the link goes dark for [`FLAP`] (100 % loss both ways), the first bulk
//! worker's sink is frozen (SIGSTOP) for [`STALL`], and gw-b is restarted. Each transfer
//! ends verified at both ends, failed at both ends (reset, or refused before the sink saw
//! it), or is counted as one-sided or hung: the last two are failures of the run. The
//! gateways' RSS and open descriptors are read every [`SAMPLE`].

use crate::bench::read_json;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wsx_lab::emulator::{Direction, LinkParams};
use wsx_lab::traffic::{SendReport, SessionsReport, SinkReport};
use wsx_lab::{Lab, Node, WanSpec, addr};

/// Bytes of each bulk transfer.
const BULK_BYTES: u64 = 20_000_000;
/// Bulk workers.
const BULK_WORKERS: usize = 2;
/// Sessions the sessions worker opens at a time.
const SESSIONS: usize = 300;
/// How long the link is dark, and the sink frozen, each cycle.
const FLAP: Duration = Duration::from_secs(5);
const STALL: Duration = Duration::from_secs(15);
/// Between samples of the gateways.
const SAMPLE: Duration = Duration::from_secs(5);
/// A transfer or a batch of sessions still running after this is hung.
const HUNG: Duration = Duration::from_secs(600);

#[derive(clap::Args, Debug)]
pub(crate) struct SoakArgs {
    /// Length of the run.
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// Seconds from one disturbance cycle (flap, stall, restart) to the next.
    #[arg(long, default_value_t = 300.0)]
    cycle_s: f64,
    /// The emulated WAN.
    #[command(flatten)]
    wan: WanSpec,
    /// Also append the record (one JSON line) to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// How a bulk transfer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Ending {
    /// Verified at both ends.
    Verified,
    /// Failed at both ends: reset, or refused before the sink saw a connection.
    FailedBothEnds,
    /// One end verified, the other failed (e.g. the receipt lost with the peer).
    OneSided,
    /// Still running after [`HUNG`].
    Hung,
}

/// One sample of the gateways.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
struct Sample {
    t_s: f64,
    rss_kib: [u64; 2],
    fds: [u64; 2],
}

/// The run's record.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SoakRecord {
    kind: String,
    minutes: f64,
    rtt_ms: f64,
    loss_pct: f64,
    rate_mbit: f64,
    /// What happened when (seconds from the start).
    events: Vec<(f64, String)>,
    samples: Vec<Sample>,
    /// What the workers counted.
    #[serde(flatten)]
    tally: Tally,
    /// gw-a's descriptors idle before the run and idle after it; its RSS after the first
    /// cycle and at the end.
    gwa_fds_idle: [u64; 2],
    gwa_rss_kib_after_first_cycle: u64,
    gwa_rss_kib_end: u64,
    passed: bool,
}

/// What the workers record.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Tally {
    bulk: BTreeMap<String, usize>,
    bulk_bytes_verified: u64,
    /// Errors the failed transfers reported (sender's, sink's), counted.
    bulk_errors: BTreeMap<String, usize>,
    sessions_opened: usize,
    sessions_proved: usize,
    session_batches: usize,
    session_batches_hung: usize,
    session_errors: BTreeMap<String, usize>,
}

/// Waits for `child` for at most `limit`; kills it after that. Whether it exited.
fn wait_at_most(child: &mut Child, limit: Duration) -> Result<bool> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if child.try_wait()?.is_some() {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    Ok(false)
}

/// Shortens an error for counting: digits (byte counts, addresses) do not make a kind.
fn kind_of(error: &str) -> String {
    error
        .chars()
        .map(|c| if c.is_ascii_digit() { '#' } else { c })
        .collect()
}

/// One bulk transfer through the gateways; the sink's pid is published in `sink_pid`.
fn bulk_once(
    lab: &Lab,
    binary: &Path,
    work: &Path,
    port: u16,
    seed: u64,
    sink_pid: &AtomicU32,
) -> Result<(Ending, u64, Vec<String>)> {
    let target = SocketAddr::new(addr::server(false), port);
    let sink_json = work.join(format!("sink-{port}.json"));
    let send_json = work.join(format!("send-{port}.json"));
    let _ = std::fs::remove_file(&sink_json);
    let _ = std::fs::remove_file(&send_json);
    let mut sink = lab
        .command(Node::Server, binary)
        .args(["sink", "--listen", &target.to_string(), "--flows", "1"])
        .args(["--idle-timeout-s", "60", "--json"])
        .arg(&sink_json)
        .stdout(Stdio::piped())
        // Failures are in the report.
        .stderr(Stdio::null())
        .spawn()
        .context("starting a sink")?;
    let mut ready = String::new();
    BufReader::new(sink.stdout.take().context("sink stdout")?).read_line(&mut ready)?;
    if !ready.starts_with("ready") {
        let _ = sink.kill();
        let _ = sink.wait();
        bail!("a sink did not start: {ready:?}");
    }
    sink_pid.store(sink.id(), Ordering::Relaxed);
    let mut sender = lab
        .command(Node::Client, binary)
        .args(["send", "--to", &target.to_string(), "--flows", "1"])
        .args([
            "--bytes",
            &BULK_BYTES.to_string(),
            "--seed",
            &seed.to_string(),
        ])
        .arg("--json")
        .arg(&send_json)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting a sender")?;
    let sent = wait_at_most(&mut sender, HUNG)?;
    // A sender refused at connect leaves the sink waiting for a connection it never gets.
    let sunk = wait_at_most(&mut sink, if sent { Duration::from_secs(90) } else { FLAP })?;
    sink_pid.store(0, Ordering::Relaxed);
    if !sent {
        return Ok((Ending::Hung, 0, vec!["sender hung".into()]));
    }
    let sender: Option<SendReport> = read_json(&send_json).ok();
    let receiver: Option<SinkReport> = read_json(&sink_json).ok();
    let sender_ok = sender.as_ref().is_some_and(SendReport::verified);
    let sink_ok = receiver.as_ref().is_some_and(SinkReport::verified);
    let mut errors: Vec<String> = Vec::new();
    if let Some(e) = sender
        .as_ref()
        .and_then(|r| r.flows.iter().find_map(|f| f.error.clone()))
    {
        errors.push(format!("sender: {}", kind_of(&e)));
    }
    if let Some(e) = receiver
        .as_ref()
        .and_then(|r| r.flows.iter().find_map(|f| f.error.clone()))
    {
        errors.push(format!("sink: {}", kind_of(&e)));
    }
    if !sunk {
        errors.push("sink saw no connection".into());
    }
    let ending = match (sender_ok, sink_ok) {
        (true, true) => Ending::Verified,
        (false, false) => Ending::FailedBothEnds,
        _ => Ending::OneSided,
    };
    let bytes = if ending == Ending::Verified {
        BULK_BYTES
    } else {
        0
    };
    Ok((ending, bytes, errors))
}

/// One batch of sessions: open, prove twice, close.
fn sessions_once(
    lab: &Lab,
    binary: &Path,
    work: &Path,
    to: SocketAddr,
    seed: u64,
) -> Result<Option<SessionsReport>> {
    let report = work.join("sessions.json");
    let _ = std::fs::remove_file(&report);
    let mut child = lab
        .command(Node::Client, binary)
        .args(["sessions", "--to", &to.to_string()])
        .args(["--count", &SESSIONS.to_string(), "--concurrency", "32"])
        .args(["--seed", &seed.to_string(), "--json"])
        .arg(&report)
        // End of input at once: the sessions are proved again and closed as soon as all
        // are open.
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting a session client")?;
    if !wait_at_most(&mut child, HUNG)? {
        return Ok(None);
    }
    Ok(Some(
        read_json(&report).context("the session client's report")?,
    ))
}

/// The gateways' RSS (KiB) and descriptors now (zeros for one between its restarts).
fn sample(pids: [u32; 2]) -> ([u64; 2], [u64; 2]) {
    let one = |pid| crate::sessions::memory_and_descriptors(pid).unwrap_or((0, 0));
    let (a, b) = (one(pids[0]), one(pids[1]));
    ([a.0, b.0], [a.1, b.1])
}

pub(crate) fn run(args: &SoakArgs) -> Result<()> {
    let binary = crate::build_lab_binary()?;
    wsx_lab::install_signal_cleanup()?;
    let lab = Lab::start(&args.wan.emulator_config())?;
    let work = crate::bench::tempdir(&lab)?;
    let mut pair = crate::gateway::Pair::start(
        &lab,
        &work,
        &binary,
        crate::gateway::Settings::default(),
        None,
    )?;
    let echo_at = SocketAddr::new(addr::server(false), 7001);
    let mut echo = lab
        .command(Node::Server, &binary)
        .args(["echo-server", "--listen", &echo_at.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the echo server")?;
    let mut ready = String::new();
    BufReader::new(echo.stdout.take().context("echo server stdout")?).read_line(&mut ready)?;
    anyhow::ensure!(ready.starts_with("ready"), "the echo server did not start");

    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(args.minutes * 60.0);
    let (_, fds_idle) = sample(pair.pids());
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let sink_pid = Arc::new(AtomicU32::new(0));
    let lab = Arc::new(lab);
    let mut workers = Vec::new();
    for k in 0..BULK_WORKERS {
        let (lab, binary, work) = (lab.clone(), binary.clone(), work.clone());
        let (stop, tally) = (stop.clone(), tally.clone());
        let sink_pid = if k == 0 {
            sink_pid.clone()
        } else {
            Arc::new(AtomicU32::new(0))
        };
        workers.push(std::thread::spawn(move || -> Result<()> {
            let mut seed = 1 + k as u64 * 1_000_000;
            while !stop.load(Ordering::Relaxed) {
                let (ending, bytes, errors) =
                    bulk_once(&lab, &binary, &work, 5201 + k as u16, seed, &sink_pid)?;
                seed += 1;
                let mut t = tally
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let name = serde_json::to_value(ending)?
                    .as_str()
                    .unwrap_or("?")
                    .to_string();
                *t.bulk.entry(name).or_default() += 1;
                t.bulk_bytes_verified += bytes;
                if ending != Ending::Verified {
                    for e in errors {
                        *t.bulk_errors.entry(e).or_default() += 1;
                    }
                }
            }
            Ok(())
        }));
    }
    {
        let (lab, binary, work) = (lab.clone(), binary.clone(), work.clone());
        let (stop, tally) = (stop.clone(), tally.clone());
        workers.push(std::thread::spawn(move || -> Result<()> {
            let mut seed = 1u64;
            while !stop.load(Ordering::Relaxed) {
                let report = sessions_once(&lab, &binary, &work, echo_at, seed)?;
                seed += 2 * SESSIONS as u64;
                let mut t = tally
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                t.session_batches += 1;
                match report {
                    Some(r) => {
                        t.sessions_opened += r.opened;
                        t.sessions_proved += r.held_verified;
                        for (e, n) in &r.errors {
                            *t.session_errors.entry(kind_of(e)).or_default() += n;
                        }
                    }
                    None => t.session_batches_hung += 1,
                }
            }
            Ok(())
        }));
    }

    // The disturbances, and the samples.
    let mut record = SoakRecord {
        kind: "soak".into(),
        minutes: args.minutes,
        rtt_ms: args.wan.rtt_ms,
        loss_pct: args.wan.loss_pct,
        rate_mbit: args.wan.rate_mbit,
        ..SoakRecord::default()
    };
    let normal = args.wan.emulator_config();
    let dark = LinkParams {
        loss_pct: 100.0,
        ..normal.a_to_b.clone()
    };
    let cycle = Duration::from_secs_f64(args.cycle_s);
    let at = |f: f64| cycle.mul_f64(f);
    let mut next_sample = start;
    let mut cycle_start = start;
    let mut done = [false; 3];
    while Instant::now() < deadline {
        let now = Instant::now();
        let t = (now - start).as_secs_f64();
        if now >= next_sample {
            let (rss_kib, fds) = sample(pair.pids());
            record.samples.push(Sample {
                t_s: t,
                rss_kib,
                fds,
            });
            next_sample += SAMPLE;
        }
        let into = now - cycle_start;
        if !done[0] && into >= at(0.2) {
            done[0] = true;
            record.events.push((t, "link dark".into()));
            lab.emulator().set(Direction::AToB, dark.clone())?;
            lab.emulator().set(Direction::BToA, dark.clone())?;
            std::thread::sleep(FLAP);
            lab.emulator().set(Direction::AToB, normal.a_to_b.clone())?;
            lab.emulator().set(Direction::BToA, normal.b_to_a.clone())?;
        }
        if !done[1] && into >= at(0.4) {
            done[1] = true;
            let pid = sink_pid.load(Ordering::Relaxed);
            if pid != 0 {
                record.events.push((t, "sink stalled".into()));
                // SAFETY: signals to a child of ours (its pid, kept while it runs).
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
                std::thread::sleep(STALL);
                // SAFETY: as above.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) };
            }
        }
        if !done[2] && into >= at(0.6) {
            done[2] = true;
            record.events.push((t, "gw-b restarted".into()));
            pair.restart(&lab, Node::GwB)?;
        }
        if into >= cycle {
            if record.gwa_rss_kib_after_first_cycle == 0 {
                record.gwa_rss_kib_after_first_cycle =
                    record.samples.last().map_or(0, |s| s.rss_kib[0]);
            }
            cycle_start += cycle;
            done = [false; 3];
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker
            .join()
            .map_err(|_| anyhow::anyhow!("a soak worker panicked"))??;
    }
    // Every session gone: the descriptors are back where they started.
    std::thread::sleep(Duration::from_secs(5));
    let (rss_end, fds_end) = sample(pair.pids());
    let _ = echo.kill();
    let _ = echo.wait();
    pair.stop(&lab)?;
    record.tally = std::mem::take(
        &mut *tally
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    record.gwa_fds_idle = [fds_idle[0], fds_end[0]];
    record.gwa_rss_kib_end = rss_end[0];
    let bad = |k: &str| record.tally.bulk.get(k).copied().unwrap_or(0);
    record.passed = bad("one_sided") == 0
        && bad("hung") == 0
        && record.tally.session_batches_hung == 0
        && fds_end[0] <= fds_idle[0];

    let line = serde_json::to_string(&record)?;
    if let Some(path) = &args.json {
        crate::bench::append_json_line(path, &line)?;
    }
    let peak = |i: usize| {
        record
            .samples
            .iter()
            .map(|s| s.rss_kib[i])
            .max()
            .unwrap_or(0)
    };
    let peak_fds = |i: usize| record.samples.iter().map(|s| s.fds[i]).max().unwrap_or(0);
    println!(
        "soak {:.0} min: bulk {:?} ({} MB verified); sessions {} opened, {} proved in {} batches ({} hung); \
         gw-a RSS {} KiB after the first cycle, {} at the end, peak {}; gw-a fds idle {} -> {}, peak {}; gw-b peak RSS {} KiB, fds {}",
        args.minutes,
        record.tally.bulk,
        record.tally.bulk_bytes_verified / 1_000_000,
        record.tally.sessions_opened,
        record.tally.sessions_proved,
        record.tally.session_batches,
        record.tally.session_batches_hung,
        record.gwa_rss_kib_after_first_cycle,
        record.gwa_rss_kib_end,
        peak(0),
        fds_idle[0],
        fds_end[0],
        peak_fds(0),
        peak(1),
        peak_fds(1),
    );
    println!("bulk errors: {:?}", record.tally.bulk_errors);
    println!("session errors: {:?}", record.tally.session_errors);
    if !record.passed {
        bail!("the soak run failed: one-sided or hung transfers, or descriptors left open");
    }
    Ok(())
}
