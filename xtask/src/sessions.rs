//! `cargo xtask bench --sessions N`: many concurrent sessions through the gateway pair (or
//! direct, for reference), with what each gateway spends on them.
//!
//! Echo servers run in the server namespace and session clients in the client namespace,
//! several processes of each so that none holds more than [`PER_PROCESS`] descriptors (the
//! host's hard limit is 20,000 per process). The clients open their sessions at once (each
//! proved by an echoed request), then hold them; meanwhile the gateways' resident memory,
//! descriptors and CPU time are read from `/proc`, and one client times [`PROBES`] fresh
//! sessions opened one after another beside the held ones. Then every held session echoes a
//! second request and closes. A case is verified only when every session and every probe
//! was echoed byte for byte, twice for the held ones.
//!
//! With `--sessions-smb` the sessions speak SMB2 instead, to the lab's simulated SMB
//! servers on port 445 (`smb-server`, several processes sharing the port): each reads a
//! file of 128 KiB to open and a second one to prove itself after the hold, byte for byte,
//! with no protocol violation at either end, and the record keeps both gateways' SMB
//! counters while the sessions are held.

use crate::bench::{Mode, read_json, tempdir};
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::Duration;
use wsx_lab::traffic::{SessionTimes, SessionsReport};
use wsx_lab::{Lab, Node, WanSpec, addr, usage_of};

/// Sessions per client process (and per echo server process).
const PER_PROCESS: usize = 8_000;

/// Fresh sessions timed one after another while the others are held.
const PROBES: usize = 200;

/// How long after the sessions closed the gateways' memory is looked at again: two of the
/// daemon's checks for freed memory to give back.
const SETTLE: Duration = Duration::from_secs(10);

/// The first echo server's port; the others follow.
const FIRST_PORT: u16 = 7001;

/// How many sessions a case opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Count {
    Exactly(usize),
    /// As many as the gateways carry through the tunnel (their reported capacity, less the
    /// margin where interception pauses): the most this machine allows.
    Most,
}

impl std::str::FromStr for Count {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "max" => Ok(Count::Most),
            n => n
                .replace('_', "")
                .parse()
                .map(Count::Exactly)
                .map_err(|_| format!("{s:?}: a number of sessions, or \"max\"")),
        }
    }
}

/// One sessions case.
#[derive(Clone, Debug)]
pub(crate) struct SessionsCase {
    pub(crate) mode: Mode,
    pub(crate) count: Count,
    pub(crate) wan: WanSpec,
    pub(crate) ipv6: bool,
    /// Connections being opened at once, over all clients.
    pub(crate) concurrency: usize,
    /// The sessions speak SMB2 to simulated servers on port 445.
    pub(crate) smb: bool,
    /// The gateways' settings (wsx mode).
    pub(crate) settings: crate::gateway::Settings,
}

/// p50 and p99 of a set of times, in microseconds.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Percentiles {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
}

impl Percentiles {
    fn of(mut ns: Vec<u64>) -> Self {
        if ns.is_empty() {
            return Self::default();
        }
        ns.sort_unstable();
        let at = |q: f64| ns[((ns.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0;
        Self {
            p50: at(0.5),
            p99: at(0.99),
        }
    }
}

/// Session times: connect, and the first request's echo after it.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Latency {
    /// From the connect call to its return (µs).
    pub(crate) connect_us: Percentiles,
    /// From the connect's return to the first echo in full (µs): one request and answer,
    /// the first of the session.
    pub(crate) echo_us: Percentiles,
    /// Probes: a second request and answer on the same session (µs).
    pub(crate) second_echo_us: Percentiles,
}

impl Latency {
    fn of(times: &[SessionTimes]) -> Self {
        Self {
            connect_us: Percentiles::of(times.iter().map(|t| t.connected_ns).collect()),
            echo_us: Percentiles::of(
                times
                    .iter()
                    .map(|t| t.first_echo_ns.saturating_sub(t.connected_ns))
                    .collect(),
            ),
            second_echo_us: Percentiles::of(
                times
                    .iter()
                    .filter(|t| t.second_echo_ns > 0)
                    .map(|t| t.second_echo_ns - t.first_echo_ns)
                    .collect(),
            ),
        }
    }
}

/// What one gateway spent on the sessions.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct GatewaySessions {
    /// Resident memory (KiB) before the sessions, while all were held, and after they closed
    /// (2 s after, and 12 s after: the daemon gives freed memory back every 5 s).
    pub(crate) idle_rss_kib: u64,
    pub(crate) held_rss_kib: u64,
    pub(crate) after_rss_kib: u64,
    #[serde(default)]
    pub(crate) settled_rss_kib: u64,
    /// Open descriptors at the same three moments.
    pub(crate) idle_fds: u64,
    pub(crate) held_fds: u64,
    pub(crate) after_fds: u64,
    /// CPU seconds (user + system) spent opening the sessions, and closing them.
    pub(crate) open_cpu_s: f64,
    pub(crate) close_cpu_s: f64,
    /// Live sessions through the tunnel (opened here or by the peer) while all were held,
    /// as the API counts them.
    pub(crate) tunnel_sessions: u64,
    /// The gateway's reported session capacity.
    pub(crate) capacity: u64,
}

/// The result of one sessions case: one JSON record.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SessionsRecord {
    pub(crate) kind: String,
    pub(crate) mode: Mode,
    pub(crate) ip: &'static str,
    pub(crate) rtt_ms: f64,
    pub(crate) loss_pct: f64,
    pub(crate) rate_mbit: f64,
    /// The rate the gateways were told (wsx mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_rate_mbit: Option<f64>,
    pub(crate) sessions: usize,
    pub(crate) opened: usize,
    pub(crate) held_verified: usize,
    pub(crate) client_processes: usize,
    pub(crate) concurrency: usize,
    /// From the first connect to the last session's first echo, over all clients.
    pub(crate) open_seconds: f64,
    pub(crate) sessions_per_second: f64,
    /// The sessions opened at once.
    pub(crate) opening: Latency,
    /// The probes: fresh sessions one at a time beside the held ones.
    pub(crate) probes: Latency,
    /// gw-a, gw-b (the wsx mode).
    pub(crate) gateways: Option<[GatewaySessions; 2]>,
    /// SMB sessions: each gateway's `smb` status (gw-a, gw-b) while all were held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) smb: Option<[serde_json::Value; 2]>,
    pub(crate) errors: BTreeMap<String, usize>,
    pub(crate) verified: bool,
}

impl SessionsRecord {
    pub(crate) fn summary(&self) -> String {
        let mut line = format!(
            "{}{} {} sessions: {}/{} opened, {} held and proved, {:.0}/s; probe connect p50 {:.0} µs, first echo p50 {:.0} p99 {:.0} µs, second echo p50 {:.0} p99 {:.0} µs",
            self.mode.label(),
            self.max_rate_mbit
                .map_or(String::new(), |r| format!(" max {r}")),
            self.sessions,
            self.opened,
            self.sessions,
            self.held_verified,
            self.sessions_per_second,
            self.probes.connect_us.p50,
            self.probes.echo_us.p50,
            self.probes.echo_us.p99,
            self.probes.second_echo_us.p50,
            self.probes.second_echo_us.p99,
        );
        if let Some(gateways) = &self.gateways {
            for (name, g) in ["gw-a", "gw-b"].iter().zip(gateways) {
                let n = self.opened.max(1) as f64;
                line += &format!(
                    "; {name}: {:.1} KiB and {:.2} fds a session, {:.3} ms CPU a session opened, \
                     RSS {} MiB idle, {} held, {} closed, {} settled",
                    (g.held_rss_kib as f64 - g.idle_rss_kib as f64) / n,
                    (g.held_fds as f64 - g.idle_fds as f64) / n,
                    g.open_cpu_s * 1000.0 / n,
                    g.idle_rss_kib >> 10,
                    g.held_rss_kib >> 10,
                    g.after_rss_kib >> 10,
                    // Records from before the settled sample have none.
                    match g.settled_rss_kib {
                        0 => "–".to_string(),
                        kib => (kib >> 10).to_string(),
                    },
                );
            }
        }
        if !self.errors.is_empty() {
            line += &format!("; errors {:?}", self.errors);
        }
        line
    }
}

/// A markdown table of sessions records.
pub(crate) fn markdown_table(records: &[SessionsRecord]) -> String {
    let mut t = String::from(
        "| mode | sessions | opened | per s | probe connect p50/p99 µs | first echo p50/p99 µs | second echo p50/p99 µs | gw-a KiB/session | gw-b KiB/session | gw-a fds/session | gw-b fds/session | gw-a CPU ms/session | gw-b CPU ms/session |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in records {
        let n = r.opened.max(1) as f64;
        let per = |f: &dyn Fn(&GatewaySessions) -> f64, i: usize, digits: usize| {
            r.gateways
                .as_ref()
                .map_or("–".to_string(), |g| format!("{:.digits$}", f(&g[i]) / n))
        };
        let rss = |g: &GatewaySessions| g.held_rss_kib as f64 - g.idle_rss_kib as f64;
        let fds = |g: &GatewaySessions| g.held_fds as f64 - g.idle_fds as f64;
        let cpu = |g: &GatewaySessions| g.open_cpu_s * 1000.0;
        t += &format!(
            "| {} | {} | {} | {:.0} | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} / {:.0} | {} | {} | {} | {} | {} | {} |\n",
            r.mode.label(),
            r.sessions,
            r.opened,
            r.sessions_per_second,
            r.probes.connect_us.p50,
            r.probes.connect_us.p99,
            r.probes.echo_us.p50,
            r.probes.echo_us.p99,
            r.probes.second_echo_us.p50,
            r.probes.second_echo_us.p99,
            per(&rss, 0, 1),
            per(&rss, 1, 1),
            per(&fds, 0, 2),
            per(&fds, 1, 2),
            per(&cpu, 0, 3),
            per(&cpu, 1, 3),
        );
    }
    t
}

/// A process's resident memory (KiB) and open descriptors now, from `/proc`.
pub(crate) fn memory_and_descriptors(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64;
    Ok((rss, fds))
}

/// A gateway's resident memory (KiB) and open descriptors now, and its CPU seconds so far.
fn sample(pid: u32) -> Result<(u64, u64, f64)> {
    let (rss, fds) = memory_and_descriptors(pid)?;
    let usage = usage_of(pid)?;
    Ok((rss, fds, usage.user_s + usage.sys_s))
}

/// A client process: its stdin (commands), its stdout (answers) and where its report goes.
struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    report: std::path::PathBuf,
}

impl Client {
    /// Waits for the line `expected`.
    fn expect(&mut self, expected: &str) -> Result<()> {
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        if line.trim() != expected {
            bail!("a session client said {line:?}, not {expected:?}");
        }
        Ok(())
    }

    fn tell(&mut self, command: &str) -> Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .context("the client's input is closed")?;
        writeln!(stdin, "{command}")?;
        stdin.flush()?;
        Ok(())
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs one sessions case; `most` is the count [`Count::Most`] resolved to by an earlier
/// wsx case, for a direct case to match.
pub(crate) fn run_case(
    case: &SessionsCase,
    binary: &Path,
    most: &mut Option<usize>,
) -> Result<SessionsRecord> {
    let lab = Lab::start(&case.wan.emulator_config())?;
    let work = tempdir(&lab)?;
    let server_ip: IpAddr = addr::server(case.ipv6);
    let pair = match case.mode {
        Mode::Wsx => Some(crate::gateway::Pair::start(
            &lab,
            &work,
            binary,
            case.settings,
            None,
        )?),
        Mode::DirectCubic | Mode::DirectBbr => None,
        other => bail!(
            "sessions cases run direct or through the intercepting gateways (wsx), not {}",
            other.label()
        ),
    };
    let capacities = match &pair {
        Some(pair) => {
            let capacity = |node| -> Result<u64> {
                pair.status(&lab, node)?["session_capacity"]
                    .as_u64()
                    .context("no session_capacity in the status")
            };
            [capacity(Node::GwA)?, capacity(Node::GwB)?]
        }
        None => [0, 0],
    };
    let count = match case.count {
        Count::Exactly(n) => n,
        Count::Most => match (&pair, *most) {
            // Interception pauses at 90 % of the capacity; leave room for the probes.
            (Some(_), _) => {
                let n = (capacities[0].min(capacities[1]) as f64 * 0.9) as usize;
                n.saturating_sub(PROBES + 100)
            }
            (None, Some(n)) => n,
            (None, None) => bail!("\"max\" sessions needs a wsx case first, to ask its capacity"),
        },
    };
    if case.count == Count::Most {
        *most = Some(count);
    }

    // Servers, one per client: echo servers on ports of their own, or SMB servers
    // sharing port 445.
    let processes = count.div_ceil(PER_PROCESS).max(1);
    let mut servers = Vec::new();
    let mut addresses = Vec::new();
    for i in 0..processes {
        let (at, command) = match case.smb {
            true => (SocketAddr::new(server_ip, 445), "smb-server"),
            false => (
                SocketAddr::new(server_ip, FIRST_PORT + i as u16),
                "echo-server",
            ),
        };
        let mut server = lab
            .command(Node::Server, binary)
            .args([command, "--listen", &at.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting an {command}"))?;
        let mut ready = String::new();
        BufReader::new(server.stdout.take().context("echo server stdout")?)
            .read_line(&mut ready)?;
        if !ready.starts_with("ready") {
            let _ = server.kill();
            bail!("an echo server did not start: {ready:?}");
        }
        servers.push(KillOnDrop(server));
        addresses.push(at);
    }
    let pids = pair.as_ref().map(|p| p.pids());
    std::thread::sleep(Duration::from_secs(1));
    let idle = pids
        .map(|[a, b]| Ok::<_, anyhow::Error>([sample(a)?, sample(b)?]))
        .transpose()?;

    // The clients, each with its share, all at once.
    let mut clients = Vec::new();
    let per_client_concurrency = (case.concurrency / processes).max(1);
    for (i, to) in addresses.iter().enumerate() {
        let share = count / processes + usize::from(i < count % processes);
        let report = work.join(format!("sessions-{i}.json"));
        let mut child = lab
            .command(Node::Client, binary)
            .args([
                "sessions",
                "--to",
                &to.to_string(),
                "--count",
                &share.to_string(),
                "--concurrency",
                &per_client_concurrency.to_string(),
                "--seed",
                &(1 + (i * PER_PROCESS * 2) as u64).to_string(),
            ])
            .args(case.smb.then_some("--smb"))
            .arg("--json")
            .arg(&report)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting a session client")?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().context("client stdout")?);
        clients.push(Client {
            child,
            stdin,
            stdout,
            report,
        });
    }
    for client in &mut clients {
        client.expect("opened")?;
    }
    let held = pids
        .map(|[a, b]| Ok::<_, anyhow::Error>([sample(a)?, sample(b)?]))
        .transpose()?;
    let tunnel_sessions = match &pair {
        Some(pair) => {
            let live = |node| -> Result<u64> {
                let sessions = &pair.status(&lab, node)?["sessions"];
                let count = |route: &str| sessions[route].as_u64().unwrap_or(0);
                Ok(count("tunnel") + count("inbound"))
            };
            [live(Node::GwA)?, live(Node::GwB)?]
        }
        None => [0, 0],
    };
    let smb = match (&pair, case.smb) {
        (Some(pair), true) => Some([
            pair.status(&lab, Node::GwA)?["smb"].clone(),
            pair.status(&lab, Node::GwB)?["smb"].clone(),
        ]),
        _ => None,
    };
    if let Some(first) = clients.first_mut() {
        first.tell(&format!("probe {PROBES}"))?;
        first.expect("probed")?;
    }
    let before_close = pids
        .map(|[a, b]| Ok::<_, anyhow::Error>([sample(a)?, sample(b)?]))
        .transpose()?;
    for client in &mut clients {
        client.tell("close")?;
        client.stdin = None;
    }
    let mut reports = Vec::new();
    for client in &mut clients {
        // The report says what failed; the exit status only that something did.
        let _ = client.child.wait()?;
        let report: SessionsReport =
            read_json(&client.report).context("a session client's report")?;
        reports.push(report);
    }
    let closed = pids
        .map(|[a, b]| Ok::<_, anyhow::Error>([sample(a)?, sample(b)?]))
        .transpose()?;
    // What the gateways keep once every session is gone.
    std::thread::sleep(Duration::from_secs(2));
    let after = pids
        .map(|[a, b]| Ok::<_, anyhow::Error>([sample(a)?, sample(b)?]))
        .transpose()?;
    if pids.is_some() {
        std::thread::sleep(SETTLE);
    }
    let settled = pids
        .map(|[a, b]| Ok::<_, anyhow::Error>([sample(a)?, sample(b)?]))
        .transpose()?;
    drop(servers);
    if let Some(pair) = pair {
        pair.stop(&lab)?;
    }
    drop(lab);
    let _ = std::fs::remove_dir_all(&work);

    let gateways = match (idle, held, before_close, closed, after, settled) {
        (Some(idle), Some(held), Some(before_close), Some(closed), Some(after), Some(settled)) => {
            let one = |i: usize| GatewaySessions {
                idle_rss_kib: idle[i].0,
                held_rss_kib: held[i].0,
                after_rss_kib: after[i].0,
                settled_rss_kib: settled[i].0,
                idle_fds: idle[i].1,
                held_fds: held[i].1,
                after_fds: after[i].1,
                open_cpu_s: held[i].2 - idle[i].2,
                close_cpu_s: closed[i].2 - before_close[i].2,
                tunnel_sessions: tunnel_sessions[i],
                capacity: capacities[i],
            };
            Some([one(0), one(1)])
        }
        _ => None,
    };
    let opened: usize = reports.iter().map(|r| r.opened).sum();
    let start = reports.iter().map(|r| r.open_start_ns).min().unwrap_or(0);
    let end = reports.iter().map(|r| r.open_end_ns).max().unwrap_or(0);
    let open_seconds = end.saturating_sub(start) as f64 / 1e9;
    let opening: Vec<SessionTimes> = reports.iter().flat_map(|r| r.opening.clone()).collect();
    let probes: Vec<SessionTimes> = reports.iter().flat_map(|r| r.probes.clone()).collect();
    let mut errors = BTreeMap::new();
    for r in &reports {
        for (e, n) in &r.errors {
            *errors.entry(e.clone()).or_default() += n;
        }
    }
    let verified = reports.iter().all(SessionsReport::verified) && probes.len() == PROBES;
    Ok(SessionsRecord {
        kind: if case.smb { "smb-sessions" } else { "sessions" }.into(),
        mode: case.mode,
        ip: if case.ipv6 { "ipv6" } else { "ipv4" },
        rtt_ms: case.wan.rtt_ms,
        loss_pct: case.wan.loss_pct,
        rate_mbit: case.wan.rate_mbit,
        max_rate_mbit: case.settings.max_rate_mbit.filter(|_| case.mode.is_wsx()),
        sessions: count,
        opened,
        held_verified: reports.iter().map(|r| r.held_verified).sum(),
        client_processes: processes,
        concurrency: per_client_concurrency * processes,
        open_seconds,
        sessions_per_second: if open_seconds > 0.0 {
            opened as f64 / open_seconds
        } else {
            0.0
        },
        opening: Latency::of(&opening),
        probes: Latency::of(&probes),
        gateways,
        smb,
        errors,
        verified,
    })
}

/// The tunnel core alone with `counts` concurrent streams, in simulation (`wsx-streams`,
/// built beside the lab's binary): one JSON record per count, and a table.
pub(crate) fn run_streams(counts: &[usize], json: Option<&Path>) -> Result<()> {
    let simulator = crate::build_lab_binary()?.with_file_name("wsx-streams");
    let mut table = String::from(
        "| streams | bytes a stream, each end | CPU µs a stream opened | CPU µs a stream closed | heap after closing / before opening |\n\
         |---:|---:|---:|---:|---:|\n",
    );
    for &count in counts {
        let output = std::process::Command::new(&simulator)
            .args(["--count", &count.to_string()])
            .stderr(Stdio::inherit())
            .output()
            .with_context(|| format!("running {}", simulator.display()))?;
        let line = String::from_utf8_lossy(&output.stdout).trim().to_string();
        let record: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("its report: {line:?}"))?;
        if !output.status.success() || record["verified"] != true {
            bail!("{count} streams not verified: {line}");
        }
        let f = |key: &str| record[key].as_f64().unwrap_or(f64::NAN);
        let row = format!(
            "| {count} | {:.0} | {:.2} | {:.2} | {:.2} |\n",
            f("bytes_per_stream_per_end"),
            f("open_cpu_us_per_stream"),
            f("close_cpu_us_per_stream"),
            f("heap_closed") / f("heap_idle"),
        );
        print!("{row}");
        table += &row;
        if let Some(path) = json {
            crate::bench::append_json_line(path, &line)?;
        }
    }
    println!("\n{table}");
    Ok(())
}

/// A child killed when it goes out of scope.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_parse_numbers_and_max() {
        assert_eq!("10_000".parse(), Ok(Count::Exactly(10_000)));
        assert_eq!("max".parse(), Ok(Count::Most));
        assert!("many".parse::<Count>().is_err());
    }

    #[test]
    fn percentiles_pick_the_middle_and_the_tail() {
        let p = Percentiles::of((1..=100).map(|i| i * 1000).collect());
        assert_eq!((p.p50, p.p99), (51.0, 99.0));
        let empty = Percentiles::of(Vec::new());
        assert_eq!((empty.p50, empty.p99), (0.0, 0.0));
    }
}
