//! `cargo xtask shaping`: the bandwidth controller's lab cases, each run through wsx's
//! shaper (on gw-a, sessions intercepted) and through the kernel's HTB (on gw-a's WAN
//! interface, plain TCP end to end) in the same session, so that the two compare in one
//! run:
//!
//! - `minimums`: A (min 30 %, priority 4), B (min 60 %, priority 4) and C (priority 0) of a
//!   100 Mbit/s root, two greedy flows each; B stops half-way. A and B must get their
//!   minimums, C the rest, the root stays used, and B's share goes to the others at once.
//! - `latency`: a request/response probe (1 KB every 10 ms) at priority 0 under four greedy
//!   flows at priority 7, which start after a few seconds of the probe alone: the probe's
//!   p99 delay added by the load.
//! - `fair-share`: ten greedy flows in one class, five CUBIC and five BBR senders, and one
//!   flow its application holds to 1 Mbit/s: Jain's index of the greedy flows over the run
//!   and in every second, and the limited flow's rate.
//!
//! With `--scale N` it instead times `wsx check-config` (best of N) on a configuration at the
//! appliance's scale: 4,096 scenarios over 8 levels, 40,000 filters, 1,024 address lists of
//! 64,000 entries.
//!
//! Classes are told apart by destination port: a `[[filter]]` each for wsx, a `u32` filter
//! each for HTB. The WAN link is faster than the root, so that the shaper, not the path,
//! divides it. Rates are compared in goodput at the sink, against the configured rate in
//! what each shaper counts (see [`payload_share`]). Every transfer is verified byte for byte.

use crate::bench::{jain, read_json, tempdir};
use crate::gateway::{Pair, Settings};
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use wsx_lab::traffic::{BUCKET_NS, ProbeReport, SendReport, SinkReport};
use wsx_lab::{Lab, Node, WanSpec, addr};

/// Which case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum ShapingCase {
    /// Minimum rates and priorities; one class stops half-way.
    Minimums,
    /// A request/response probe at priority 0 under greedy load at priority 7.
    Latency,
    /// Ten greedy flows (CUBIC and BBR) and one limited to 1 Mbit/s in one class.
    FairShare,
}

/// Who shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Shaper {
    /// wsx's shaper on gw-a, the sessions intercepted and carried by the tunnel.
    Wsx,
    /// The kernel's HTB on gw-a's WAN interface (burst of 1 ms at each rate, pfifo leaves),
    /// plain kernel TCP end to end.
    Htb,
}

#[derive(clap::Args, Debug)]
pub(crate) struct ShapingArgs {
    /// The cases to run [default: all three].
    #[arg(long, value_enum)]
    case: Vec<ShapingCase>,
    /// Who shapes [default: wsx, then HTB].
    #[arg(long, value_enum)]
    by: Vec<Shaper>,
    /// Seconds per case.
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    /// Also append the records (JSON Lines) to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Instead of the cases: time `wsx check-config` on a configuration at the
    /// appliance's scale (4,096 scenarios over 8 levels, 1,024 address lists of 64,000
    /// entries, 40,000 filters), best of this many runs.
    #[arg(long)]
    scale: Option<u32>,
}

/// A class of traffic: a wsx scenario and an HTB class alike.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Class {
    pub(crate) name: String,
    pub(crate) ports: Vec<u16>,
    pub(crate) min_mbit: Option<f64>,
    pub(crate) max_mbit: Option<f64>,
    pub(crate) priority: u8,
}

/// Senders of one kind: `flows` TCP connections to `port`, from `start_s` for `seconds`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Group {
    pub(crate) name: String,
    pub(crate) port: u16,
    pub(crate) flows: u16,
    pub(crate) cc: String,
    pub(crate) start_s: f64,
    pub(crate) seconds: f64,
    /// Each flow limited by its application to this rate.
    pub(crate) rate_mbit: Option<f64>,
}

/// The request/response probe: to `port`, from `start_s` for `seconds`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Probe {
    pub(crate) port: u16,
    pub(crate) start_s: f64,
    pub(crate) seconds: f64,
}

/// A case's lab, classes and traffic.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Setup {
    /// The root rate both shapers divide.
    pub(crate) root_mbit: f64,
    /// The emulated WAN's rate, above the root.
    pub(crate) link_mbit: f64,
    pub(crate) rtt_ms: f64,
    pub(crate) classes: Vec<Class>,
    pub(crate) groups: Vec<Group>,
    pub(crate) probe: Option<Probe>,
}

fn group(name: &str, port: u16, flows: u16, cc: &str, (start_s, seconds): (f64, f64)) -> Group {
    Group {
        name: name.into(),
        port,
        flows,
        cc: cc.into(),
        start_s,
        seconds,
        rate_mbit: None,
    }
}

fn class(name: &str, ports: &[u16], min_mbit: Option<f64>, priority: u8) -> Class {
    Class {
        name: name.into(),
        ports: ports.to_vec(),
        min_mbit,
        max_mbit: None,
        priority,
    }
}

impl ShapingCase {
    fn label(self) -> &'static str {
        match self {
            ShapingCase::Minimums => "minimums",
            ShapingCase::Latency => "latency",
            ShapingCase::FairShare => "fair-share",
        }
    }

    fn setup(self, seconds: f64) -> Setup {
        match self {
            ShapingCase::Minimums => Setup {
                root_mbit: 100.0,
                link_mbit: 120.0,
                rtt_ms: 100.0,
                classes: vec![
                    class("a", &[5201], Some(30.0), 4),
                    class("b", &[5202], Some(60.0), 4),
                    class("c", &[5203], None, 0),
                ],
                groups: vec![
                    group("a", 5201, 2, "cubic", (0.0, seconds)),
                    group("b", 5202, 2, "cubic", (0.0, seconds / 2.0)),
                    group("c", 5203, 2, "cubic", (0.0, seconds)),
                ],
                probe: None,
            },
            ShapingCase::Latency => Setup {
                root_mbit: 90.0,
                link_mbit: 100.0,
                rtt_ms: 100.0,
                classes: vec![
                    class("probe", &[5301], None, 0),
                    class("bulk", &[5201], None, 7),
                ],
                groups: vec![group("bulk", 5201, 4, "cubic", (4.0, seconds - 4.0))],
                probe: Some(Probe {
                    port: 5301,
                    start_s: 0.0,
                    seconds,
                }),
            },
            ShapingCase::FairShare => Setup {
                root_mbit: 50.0,
                link_mbit: 100.0,
                rtt_ms: 100.0,
                classes: vec![class("bench", &[5201, 5202, 5203], None, 4)],
                groups: vec![
                    group("cubic", 5201, 5, "cubic", (0.0, seconds)),
                    group("bbr", 5202, 5, "bbr", (0.0, seconds)),
                    Group {
                        rate_mbit: Some(1.0),
                        ..group("limited", 5203, 1, "cubic", (0.0, seconds))
                    },
                ],
                probe: None,
            },
        }
    }
}

/// One case through one shaper.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) case: ShapingCase,
    pub(crate) by: Shaper,
    pub(crate) setup: Setup,
    /// Goodput per byte the shaper counts (see [`payload_share`]).
    pub(crate) payload_share: f64,
    pub(crate) groups: Vec<GroupResult>,
    pub(crate) probe: Option<ProbeFigures>,
    /// What the case requires, measured.
    pub(crate) checks: Vec<Check>,
    /// gw-a's shaper as its API showed it at the end (wsx).
    pub(crate) shaper: Option<serde_json::Value>,
    /// CPU seconds of each gateway (wsx).
    pub(crate) gateway_cpu_s: Option<[f64; 2]>,
    /// Every transfer and every probe answer arrived intact.
    pub(crate) verified: bool,
}

/// One group's transfer at the sink, on the case's common timeline.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct GroupResult {
    pub(crate) name: String,
    pub(crate) bytes: u64,
    /// When its last byte arrived, seconds from the case's origin.
    pub(crate) last_byte_s: f64,
    /// Goodput per 100 ms, Mbit/s.
    pub(crate) series_mbit: Vec<f64>,
    /// Each flow's goodput per second, Mbit/s.
    pub(crate) flow_seconds_mbit: Vec<Vec<f64>>,
    pub(crate) verified: bool,
}

/// The probe's delays, ms.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ProbeFigures {
    pub(crate) unloaded_p50_ms: f64,
    pub(crate) unloaded_p99_ms: f64,
    pub(crate) loaded_p50_ms: f64,
    pub(crate) loaded_p99_ms: f64,
    pub(crate) loaded_max_ms: f64,
    /// Loaded p99 less the unloaded median: the delay the load adds.
    pub(crate) added_p99_ms: f64,
    pub(crate) samples: usize,
}

/// A requirement and what was measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Check {
    pub(crate) what: String,
    pub(crate) measured: f64,
    pub(crate) target: String,
    pub(crate) met: bool,
}

fn check(what: impl Into<String>, measured: f64, target: impl Into<String>, met: bool) -> Check {
    Check {
        what: what.into(),
        measured,
        target: target.into(),
        met,
    }
}

pub(crate) fn run(args: &ShapingArgs) -> Result<()> {
    if let Some(runs) = args.scale {
        return scale(runs.max(1));
    }
    let cases = if args.case.is_empty() {
        vec![
            ShapingCase::Minimums,
            ShapingCase::Latency,
            ShapingCase::FairShare,
        ]
    } else {
        args.case.clone()
    };
    let shapers = if args.by.is_empty() {
        vec![Shaper::Wsx, Shaper::Htb]
    } else {
        args.by.clone()
    };
    let binary = crate::build_lab_binary()?;
    wsx_lab::install_signal_cleanup()?;
    let out_dir = crate::workspace_root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let mut records = Vec::new();
    for &case in &cases {
        for &by in &shapers {
            println!("{} through {by:?} ...", case.label());
            let record = run_case(case, by, args.seconds, &binary)
                .with_context(|| format!("case {} through {by:?}", case.label()))?;
            println!("{}", table(std::slice::from_ref(&record)));
            if let Some(path) = &args.json {
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?;
                use std::io::Write as _;
                writeln!(file, "{}", serde_json::to_string(&record)?)?;
            }
            records.push(record);
        }
    }
    let text = table(&records);
    std::fs::write(out_dir.join("shaping.md"), &text)?;
    println!("{text}");
    if let Some(bad) = records.iter().find(|r| !r.verified) {
        bail!(
            "a transfer of {} through {:?} was not verified",
            bad.case.label(),
            bad.by
        );
    }
    Ok(())
}

/// Goodput per byte the shaper counts. HTB counts Ethernet frames: 1514 bytes carry 1448
/// of payload (IPv4, TCP timestamps). wsx counts the tunnel stream's bytes: 16,387 carry
/// 16,384 of payload (the chunk header of incompressible data).
fn payload_share(by: Shaper) -> f64 {
    match by {
        Shaper::Htb => 1448.0 / 1514.0,
        Shaper::Wsx => 16384.0 / 16387.0,
    }
}

fn run_case(case: ShapingCase, by: Shaper, seconds: f64, binary: &Path) -> Result<Record> {
    let setup = case.setup(seconds);
    let wan = WanSpec {
        rtt_ms: setup.rtt_ms,
        rate_mbit: setup.link_mbit,
        ..WanSpec::default()
    };
    let lab = Lab::start(&wan.emulator_config())?;
    let work = tempdir(&lab)?;
    let gateways = match by {
        Shaper::Wsx => Some(Pair::start_shaped(
            &lab,
            &work,
            binary,
            Settings::default(),
            &wsx_config(&setup),
        )?),
        Shaper::Htb => {
            install_htb(&lab, &setup)?;
            None
        }
    };
    let server = |port| SocketAddr::new(addr::server(false), port);
    // Sinks and the echo server first, each ready before anything is sent.
    let mut sinks = Vec::new();
    for g in &setup.groups {
        let json = work.join(format!("sink-{}.json", g.name));
        let mut sink = lab.command(Node::Server, binary);
        sink.args(["sink", "--listen", &server(g.port).to_string()])
            .args(["--flows", &g.flows.to_string()])
            .arg("--json")
            .arg(&json);
        sinks.push(spawn_ready(sink, "sink")?);
    }
    let echo = match &setup.probe {
        Some(p) => {
            let mut echo = lab.command(Node::Server, binary);
            echo.args(["echo", "--listen", &server(p.port).to_string()]);
            Some(spawn_ready(echo, "echo server")?)
        }
        None => None,
    };
    // The senders, each after its start time.
    let mut senders: Vec<(f64, Command, PathBuf)> = Vec::new();
    for g in &setup.groups {
        let json = work.join(format!("send-{}.json", g.name));
        let mut send = lab.command(Node::Client, binary);
        send.args(["send", "--to", &server(g.port).to_string()])
            .args(["--flows", &g.flows.to_string()])
            .args(["--seconds", &g.seconds.to_string()])
            .args(["--cc", &g.cc])
            .arg("--json")
            .arg(&json)
            .stdout(Stdio::null());
        if let Some(rate) = g.rate_mbit {
            send.args(["--rate-mbit", &rate.to_string()]);
        }
        senders.push((g.start_s, send, json));
    }
    let probe_json = work.join("probe.json");
    if let Some(p) = &setup.probe {
        let mut probe = lab.command(Node::Client, binary);
        probe
            .args(["probe", "--to", &server(p.port).to_string()])
            .args(["--seconds", &p.seconds.to_string()])
            .arg("--json")
            .arg(&probe_json)
            .stdout(Stdio::null());
        senders.push((p.start_s, probe, probe_json.clone()));
    }
    let statuses: Vec<bool> = std::thread::scope(|scope| {
        let handles: Vec<_> = senders
            .iter_mut()
            .map(|(start_s, command, _)| {
                let start = Duration::from_secs_f64(*start_s);
                scope.spawn(move || {
                    std::thread::sleep(start);
                    command.status().is_ok_and(|s| s.success())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(false))
            .collect()
    });
    let mut sinks_ok = true;
    for mut sink in sinks {
        sinks_ok &= sink.wait().is_ok_and(|s| s.success());
    }
    if let Some(mut echo) = echo {
        sinks_ok &= echo.wait().is_ok_and(|s| s.success());
    }
    let shaper = match &gateways {
        Some(pair) => pair.shaper_state(&lab, Node::GwA)?,
        None => None,
    };
    let usage = gateways.map(|g| g.stop(&lab)).transpose()?;
    drop(lab);

    let mut sends = Vec::new();
    let mut received = Vec::new();
    for g in &setup.groups {
        let sent: SendReport = read_json(&work.join(format!("send-{}.json", g.name)))
            .with_context(|| format!("{}'s sender report", g.name))?;
        let sink: SinkReport = read_json(&work.join(format!("sink-{}.json", g.name)))
            .with_context(|| format!("{}'s sink report", g.name))?;
        sends.push(sent);
        received.push(sink);
    }
    let probe: Option<ProbeReport> = match &setup.probe {
        Some(_) => Some(read_json(&probe_json).context("the probe's report")?),
        None => None,
    };
    let _ = std::fs::remove_dir_all(&work);

    // The case's origin: the first sender's.
    let origin = sends
        .iter()
        .map(|s| s.origin_ns)
        .chain(probe.iter().map(|p| p.origin_ns))
        .min()
        .unwrap_or(0);
    let groups: Vec<GroupResult> = setup
        .groups
        .iter()
        .zip(sends.iter().zip(&received))
        .map(|(g, (sent, sink))| group_result(g, sent, sink, origin))
        .collect();
    let share = payload_share(by);
    let probe_figures = match (&setup.probe, &probe) {
        (Some(p), Some(report)) => {
            let bulk_start = setup
                .groups
                .iter()
                .map(|g| g.start_s)
                .fold(f64::INFINITY, f64::min);
            probe_figures(report, origin, p, bulk_start, seconds)
        }
        _ => None,
    };
    let checks = match case {
        ShapingCase::Minimums => minimums_checks(&setup, &groups, share, seconds),
        ShapingCase::Latency => latency_checks(&setup, &groups, probe_figures.as_ref(), share),
        ShapingCase::FairShare => fair_share_checks(&groups, seconds),
    };
    let verified = statuses.iter().all(|&ok| ok)
        && sinks_ok
        && sends.iter().all(SendReport::verified)
        && received.iter().all(SinkReport::verified)
        && probe.as_ref().is_none_or(|p| p.verified);
    Ok(Record {
        case,
        by,
        payload_share: share,
        groups,
        probe: probe_figures,
        checks,
        shaper,
        gateway_cpu_s: usage.map(|[(a, _), (b, _)]| [a.user_s + a.sys_s, b.user_s + b.sys_s]),
        verified,
        setup,
    })
}

/// Starts `command` with its standard output piped and waits for its "ready" line.
pub(crate) fn spawn_ready(mut command: Command, what: &str) -> Result<Child> {
    let mut child = command
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting the {what}"))?;
    let mut ready = String::new();
    BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut ready)?;
    if !ready.starts_with("ready") {
        let _ = child.kill();
        bail!("the {what} did not start: {ready:?}");
    }
    Ok(child)
}

/// gw-a's shaper for `setup`: a scenario and a filter per class.
fn wsx_config(setup: &Setup) -> String {
    let mut text = format!("\n[shaper]\nwan_rate = \"{} Mbit/s\"\n", setup.root_mbit);
    for c in &setup.classes {
        let _ = write!(
            text,
            "\n[[scenario]]\nname = \"{}\"\npriority = {}\n",
            c.name, c.priority
        );
        if let Some(min) = c.min_mbit {
            let _ = writeln!(text, "min_rate = \"{min} Mbit/s\"");
        }
        if let Some(max) = c.max_mbit {
            let _ = writeln!(text, "max_rate = \"{max} Mbit/s\"");
        }
    }
    for c in &setup.classes {
        let ports: Vec<String> = c.ports.iter().map(u16::to_string).collect();
        let _ = write!(
            text,
            "\n[[filter]]\nscenario = \"{}\"\ndestination_port = [{}]\n",
            c.name,
            ports.join(", ")
        );
    }
    text
}

/// HTB on gw-a's WAN interface for `setup`: a root class at the root rate, under it a class
/// per class of the setup (its minimum as the rate, 1 % of the root without one; the root
/// or its maximum as the ceiling; its priority), each with a pfifo leaf and a `u32` filter
/// per destination port. Bursts are 1 ms at the rate, at least a full frame.
fn install_htb(lab: &Lab, setup: &Setup) -> Result<()> {
    let netns = lab.netns(Node::GwA);
    let kbit = |mbit: f64| (mbit * 1000.0).round() as u64;
    let burst = |kbit: u64| (kbit * 1000 / 8 / 1000).max(1600).to_string();
    let tc = |args: &[&str]| {
        wsx_lab::netns::exec(&netns, "tc", args)
            .map(|_| ())
            .context("installing HTB on gw-a")
    };
    let root = kbit(setup.root_mbit);
    let last = format!("{:x}", 0x10 + setup.classes.len() - 1);
    tc(&[
        "qdisc", "add", "dev", "wan0", "root", "handle", "1:", "htb", "default", &last,
    ])?;
    let (rate, b) = (format!("{root}kbit"), burst(root));
    tc(&[
        "class", "add", "dev", "wan0", "parent", "1:", "classid", "1:1", "htb", "rate", &rate,
        "ceil", &rate, "burst", &b, "cburst", &b,
    ])?;
    for (i, c) in setup.classes.iter().enumerate() {
        let id = format!("{:x}", 0x10 + i);
        let rate_kbit = c.min_mbit.map_or(root / 100, kbit);
        let ceil_kbit = c.max_mbit.map_or(root, kbit);
        let (rate, ceil) = (format!("{rate_kbit}kbit"), format!("{ceil_kbit}kbit"));
        let (b, cb) = (burst(rate_kbit), burst(ceil_kbit));
        let prio = c.priority.to_string();
        let classid = format!("1:{id}");
        tc(&[
            "class", "add", "dev", "wan0", "parent", "1:1", "classid", &classid, "htb", "rate",
            &rate, "ceil", &ceil, "prio", &prio, "burst", &b, "cburst", &cb,
        ])?;
        let handle = format!("{id}:");
        tc(&[
            "qdisc", "add", "dev", "wan0", "parent", &classid, "handle", &handle, "pfifo", "limit",
            "1000",
        ])?;
        for port in &c.ports {
            let port = port.to_string();
            tc(&[
                "filter", "add", "dev", "wan0", "parent", "1:", "protocol", "ip", "prio", "1",
                "u32", "match", "ip", "dport", &port, "0xffff", "flowid", &classid,
            ])?;
        }
    }
    Ok(())
}

/// A group's goodput on the case's timeline (which starts at `origin`).
fn group_result(g: &Group, sent: &SendReport, sink: &SinkReport, origin: u64) -> GroupResult {
    // Each flow's buckets count from its sender's origin.
    let shift = ((sent.origin_ns.saturating_sub(origin) + BUCKET_NS / 2) / BUCKET_NS) as usize;
    let per_bucket = |bytes: u64| bytes as f64 * 8.0 / (BUCKET_NS as f64 / 1e9) / 1e6;
    let len = sink
        .flows
        .iter()
        .map(|f| f.buckets.len() + shift)
        .max()
        .unwrap_or(0);
    let mut total = vec![0u64; len];
    let per_second = (1e9 / BUCKET_NS as f64) as usize;
    let mut flow_seconds_mbit = Vec::new();
    for flow in &sink.flows {
        let mut aligned = vec![0u64; len];
        for (i, &b) in flow.buckets.iter().enumerate() {
            aligned[i + shift] += b;
            total[i + shift] += b;
        }
        flow_seconds_mbit.push(
            aligned
                .chunks(per_second)
                .map(|s| s.iter().sum::<u64>() as f64 * 8.0 / 1e6)
                .collect(),
        );
    }
    let last = sink
        .flows
        .iter()
        .map(|f| f.last_byte_ns)
        .max()
        .unwrap_or(origin);
    GroupResult {
        name: g.name.clone(),
        bytes: sink.flows.iter().map(|f| f.bytes).sum(),
        last_byte_s: last.saturating_sub(origin) as f64 / 1e9,
        series_mbit: total.iter().map(|&b| per_bucket(b)).collect(),
        flow_seconds_mbit,
        verified: sent.verified() && sink.verified(),
    }
}

/// Mean goodput of `g` over [from_s, to_s), Mbit/s.
fn mean_mbit(g: &GroupResult, from_s: f64, to_s: f64) -> f64 {
    let per_second = 1e9 / BUCKET_NS as f64;
    let (from, to) = (
        (from_s * per_second).round() as usize,
        (to_s * per_second).round() as usize,
    );
    if to <= from {
        return 0.0;
    }
    (from..to)
        .map(|i| g.series_mbit.get(i).copied().unwrap_or(0.0))
        .sum::<f64>()
        / (to - from) as f64
}

fn find<'a>(groups: &'a [GroupResult], name: &str) -> Option<&'a GroupResult> {
    groups.iter().find(|g| g.name == name)
}

fn minimums_checks(setup: &Setup, groups: &[GroupResult], share: f64, seconds: f64) -> Vec<Check> {
    let (Some(a), Some(b), Some(c)) = (find(groups, "a"), find(groups, "b"), find(groups, "c"))
    else {
        return Vec::new();
    };
    let root = setup.root_mbit * share;
    let half = seconds / 2.0;
    let (from, to) = (3.0, half - 1.0);
    let (ma, mb, mc) = (
        mean_mbit(a, from, to),
        mean_mbit(b, from, to),
        mean_mbit(c, from, to),
    );
    let minimum = |name: &str| {
        setup
            .classes
            .iter()
            .find(|k| k.name == name)
            .and_then(|k| k.min_mbit)
            .unwrap_or(0.0)
            * share
    };
    let window = format!("{from:.0}-{to:.0} s");
    let mut checks = vec![
        check(
            format!("A, Mbit/s, {window}"),
            ma,
            format!("≥ {:.2} (min, -1 %)", minimum("a") * 0.99),
            ma >= minimum("a") * 0.99,
        ),
        check(
            format!("B, Mbit/s, {window}"),
            mb,
            format!("≥ {:.2} (min, -1 %)", minimum("b") * 0.99),
            mb >= minimum("b") * 0.99,
        ),
        check(
            format!("C, Mbit/s, {window}"),
            mc,
            format!("the rest: {:.2}", root - minimum("a") - minimum("b")),
            mc >= (root - minimum("a") - minimum("b")) * 0.9,
        ),
        check(
            format!("root used, %, {window}"),
            (ma + mb + mc) / root * 100.0,
            "≥ 99",
            ma + mb + mc >= 0.99 * root,
        ),
    ];
    // After B: its last byte, then the next whole 100 ms.
    let after = (b.last_byte_s * 10.0).ceil() / 10.0;
    let (from2, to2) = (after + 2.0, seconds - 1.0);
    let (ma2, mc2) = (mean_mbit(a, from2, to2), mean_mbit(c, from2, to2));
    let window2 = format!("{from2:.1}-{to2:.0} s");
    checks.push(check(
        format!("A, Mbit/s, {window2} (B done)"),
        ma2,
        format!("≥ {:.2}", minimum("a") * 0.99),
        ma2 >= minimum("a") * 0.99,
    ));
    checks.push(check(
        format!("root used, %, {window2}"),
        (ma2 + mc2) / root * 100.0,
        "≥ 99",
        ma2 + mc2 >= 0.99 * root,
    ));
    // How soon A and C took B's share: what they carried in the first whole 100 ms after
    // B's last byte (which ends at most 200 ms after it).
    let first = (after * 10.0).round() as usize;
    let at = |g: &GroupResult| g.series_mbit.get(first).copied().unwrap_or(0.0);
    let taken = (at(a) + at(c)) / root * 100.0;
    checks.push(check(
        format!(
            "A + C, % of the root, first whole 100 ms after B's last byte ({:.0}-{:.0} ms after)",
            (after - b.last_byte_s) * 1000.0,
            (after + 0.1 - b.last_byte_s) * 1000.0
        ),
        taken,
        "≥ 99",
        taken >= 99.0,
    ));
    checks
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn probe_figures(
    report: &ProbeReport,
    origin: u64,
    probe: &Probe,
    load_start_s: f64,
    seconds: f64,
) -> Option<ProbeFigures> {
    let shift = report.origin_ns.saturating_sub(origin);
    let at = |sent: u64| (sent + shift) as f64 / 1e9;
    let delays = |from: f64, to: f64| {
        let mut d: Vec<f64> = report
            .samples
            .iter()
            .filter(|&&(sent, _)| (from..to).contains(&at(sent)))
            .map(|&(_, rtt)| rtt as f64 / 1e6)
            .collect();
        d.sort_by(f64::total_cmp);
        d
    };
    let unloaded = delays(probe.start_s + 0.5, load_start_s);
    let loaded = delays(load_start_s + 2.0, seconds - 1.0);
    if unloaded.is_empty() || loaded.is_empty() {
        return None;
    }
    let base = quantile(&unloaded, 0.5);
    Some(ProbeFigures {
        unloaded_p50_ms: base,
        unloaded_p99_ms: quantile(&unloaded, 0.99),
        loaded_p50_ms: quantile(&loaded, 0.5),
        loaded_p99_ms: quantile(&loaded, 0.99),
        loaded_max_ms: loaded.last().copied().unwrap_or(f64::NAN),
        added_p99_ms: quantile(&loaded, 0.99) - base,
        samples: unloaded.len() + loaded.len(),
    })
}

fn latency_checks(
    setup: &Setup,
    groups: &[GroupResult],
    probe: Option<&ProbeFigures>,
    share: f64,
) -> Vec<Check> {
    let mut checks = Vec::new();
    if let Some(p) = probe {
        checks.push(check(
            "probe p99 added delay, ms (loaded p99 - unloaded p50)",
            p.added_p99_ms,
            "≤ 5",
            p.added_p99_ms <= 5.0,
        ));
    }
    if let (Some(bulk), Some(g)) = (find(groups, "bulk"), setup.groups.first()) {
        let (from, to) = (g.start_s + 2.0, g.start_s + g.seconds - 1.0);
        let root = setup.root_mbit * share;
        let m = mean_mbit(bulk, from, to);
        checks.push(check(
            format!("bulk, % of the root, {from:.0}-{to:.0} s"),
            m / root * 100.0,
            "≥ 98 (the probe takes ~0.8 %)",
            m >= 0.98 * root,
        ));
    }
    checks
}

fn fair_share_checks(groups: &[GroupResult], seconds: f64) -> Vec<Check> {
    let greedy: Vec<&Vec<f64>> = groups
        .iter()
        .filter(|g| g.name != "limited")
        .flat_map(|g| &g.flow_seconds_mbit)
        .collect();
    let seconds_range = 2..(seconds as usize).saturating_sub(1);
    let per_second: Vec<f64> = seconds_range
        .clone()
        .map(|s| {
            let xs: Vec<f64> = greedy
                .iter()
                .map(|f| f.get(s).copied().unwrap_or(0.0))
                .collect();
            jain(&xs)
        })
        .collect();
    let totals: Vec<f64> = greedy
        .iter()
        .map(|f| {
            seconds_range
                .clone()
                .map(|s| f.get(s).copied().unwrap_or(0.0))
                .sum()
        })
        .collect();
    let over_run = jain(&totals);
    let worst = per_second.iter().copied().fold(f64::INFINITY, f64::min);
    let window = format!("{}-{} s", seconds_range.start, seconds_range.end);
    let mut checks = vec![
        check(
            format!("Jain, greedy flows, {window}"),
            over_run,
            "≥ 0.99",
            over_run >= 0.99,
        ),
        check(
            format!("Jain, greedy flows, worst second of {window}"),
            worst,
            "≥ 0.98",
            worst >= 0.98,
        ),
    ];
    let mean_of = |name: &str| {
        find(groups, name).map(|g| {
            let flows = g.flow_seconds_mbit.len().max(1) as f64;
            let sum: f64 = g
                .flow_seconds_mbit
                .iter()
                .map(|f| {
                    seconds_range
                        .clone()
                        .map(|s| f.get(s).copied().unwrap_or(0.0))
                        .sum::<f64>()
                })
                .sum();
            sum / flows / seconds_range.len().max(1) as f64
        })
    };
    if let (Some(cubic), Some(bbr)) = (mean_of("cubic"), mean_of("bbr")) {
        checks.push(check(
            format!("BBR flow / CUBIC flow, {window}"),
            bbr / cubic,
            "1 (equal)",
            (0.95..=1.05).contains(&(bbr / cubic)),
        ));
    }
    if let Some(limited) = mean_of("limited") {
        checks.push(check(
            format!("limited flow, Mbit/s, {window}"),
            limited,
            "≥ 0.99 (its 1 Mbit/s)",
            limited >= 0.99,
        ));
    }
    checks
}

/// The records' checks as a markdown table.
pub(crate) fn table(records: &[Record]) -> String {
    let mut out = String::from(
        "| case | shaper | check | measured | target | met | verified |\n|---|---|---|---:|---|---|---|\n",
    );
    for r in records {
        for c in &r.checks {
            let _ = writeln!(
                out,
                "| {} | {:?} | {} | {:.3} | {} | {} | {} |",
                r.case.label(),
                r.by,
                c.what,
                c.measured,
                c.target,
                if c.met { "yes" } else { "no" },
                if r.verified { "yes" } else { "no" },
            );
        }
        if let Some(p) = &r.probe {
            let _ = writeln!(
                out,
                "| {} | {:?} | probe ms: unloaded p50 {:.1} p99 {:.1}; loaded p50 {:.1} p99 {:.1} max {:.1} ({} samples) | | | | |",
                r.case.label(),
                r.by,
                p.unloaded_p50_ms,
                p.unloaded_p99_ms,
                p.loaded_p50_ms,
                p.loaded_p99_ms,
                p.loaded_max_ms,
                p.samples,
            );
        }
    }
    out
}

/// Scenarios, address lists, their entries and filters of the scale configuration.
const SCALE: (usize, usize, usize, usize) = (4096, 1024, 64_000, 40_000);

/// A gateway's configuration with the shaper at the appliance's published limits: two
/// top scenarios and every other one under the scenario `(i - 2) / 3` (8 levels), the last
/// being `default`, maximums and priorities varied; address lists of /32s; filters on the
/// leaves by list, prefix and port range in turn.
fn scale_config() -> String {
    use wsx_tunnel::SecretKey;
    let (scenarios, lists, entries, filters) = SCALE;
    let (own, peer) = (SecretKey::generate(), SecretKey::generate());
    let endpoint = SocketAddr::from(([192, 0, 2, 1], 4500));
    let mut text = crate::gateway::config_text(
        &own,
        &peer,
        endpoint,
        "[\"10.0.0.0/8\"]",
        Settings::default(),
    );
    text += "\n[shaper]\nwan_rate = \"10 Gbit/s\"\n";
    let parent = |i: usize| (i >= 2).then(|| (i - 2) / 3);
    let mut has_children = vec![false; scenarios];
    for i in 0..scenarios {
        if let Some(p) = parent(i) {
            has_children[p] = true;
        }
    }
    // The last one is the leaf for unmatched sessions: "default" counts among the 4,096.
    let name = |i: usize| {
        if i + 1 == scenarios {
            "default".to_string()
        } else {
            format!("s{i}")
        }
    };
    for i in 0..scenarios {
        let _ = write!(
            text,
            "\n[[scenario]]\nname = \"{}\"\npriority = {}\n",
            name(i),
            i % 8
        );
        if let Some(p) = parent(i) {
            let _ = writeln!(text, "parent = \"s{p}\"");
        }
        let _ = writeln!(text, "max_rate = \"{} Mbit/s\"", 10 + i % 990);
    }
    for l in 0..lists {
        let _ = write!(text, "\n[[address_list]]\nname = \"l{l}\"\nprefixes = [");
        let per = entries / lists + usize::from(l < entries % lists);
        for e in 0..per {
            let sep = if e == 0 { "" } else { ", " };
            let _ = write!(
                text,
                "{sep}\"10.{}.{}.{}/32\"",
                l / 4,
                (l % 4) * 64 + e / 256,
                e % 256
            );
        }
        text += "]\n";
    }
    let leaves: Vec<usize> = (0..scenarios).filter(|&i| !has_children[i]).collect();
    for f in 0..filters {
        let leaf = leaves[f % leaves.len()];
        let _ = write!(text, "\n[[filter]]\nscenario = \"{}\"\n", name(leaf));
        match f % 3 {
            0 => {
                let _ = writeln!(text, "destination_list = [\"l{}\"]", f % lists);
            }
            1 => {
                let _ = writeln!(
                    text,
                    "source = [\"172.{}.{}.0/24\"]",
                    16 + (f / 256) % 16,
                    f % 256
                );
            }
            _ => {
                let port = 1024 + (f % 60_000) as u16;
                let _ = writeln!(text, "destination_port = [\"{port}-{}\"]", port + 1);
            }
        }
    }
    text
}

/// Times `wsx check-config` (parse, check, build the tree and the classifier) on the scale
/// configuration, best of `runs`, with its peak memory.
fn scale(runs: u32) -> Result<()> {
    let binary = crate::build_lab_binary()?;
    let wsx = binary.with_file_name("wsx");
    let dir = std::env::temp_dir().join(format!("wsx-shaping-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("wsx.toml");
    let text = scale_config();
    std::fs::write(&file, &text)?;
    let mut best: Option<(Duration, u64)> = None;
    for _ in 0..runs {
        let started = std::time::Instant::now();
        let child = Command::new(&wsx)
            .arg("check-config")
            .arg(&file)
            .stdout(Stdio::null())
            .spawn()
            .context("running wsx check-config")?;
        let (ok, max_rss_kb) = wait_with_rss(child)?;
        let took = started.elapsed();
        if !ok {
            bail!("wsx check-config refused {}", file.display());
        }
        if best.is_none_or(|(b, _)| took < b) {
            best = Some((took, max_rss_kb));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let (took, rss) = best.context("no run")?;
    let (scenarios, lists, entries, filters) = SCALE;
    println!(
        "{scenarios} scenarios over 8 levels, {lists} address lists of {entries} entries, \
         {filters} filters ({:.1} MB of TOML): wsx check-config {:.0} ms (best of {runs}), \
         peak RSS {:.0} MiB",
        text.len() as f64 / 1e6,
        took.as_secs_f64() * 1000.0,
        rss as f64 / 1024.0
    );
    Ok(())
}

/// Waits for `child`; whether it succeeded, and its peak resident memory in KiB.
fn wait_with_rss(child: Child) -> Result<(bool, u64)> {
    let mut status = 0;
    // SAFETY: a zeroed rusage is valid; wait4 fills it for our own child's pid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    // SAFETY: `status` and `usage` are valid for writes during the call.
    let rc = unsafe { libc::wait4(pid, &raw mut status, 0, &raw mut usage) };
    if rc != pid {
        return Err(std::io::Error::last_os_error()).context("waiting for wsx check-config");
    }
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    Ok((ok, u64::try_from(usage.ru_maxrss).unwrap_or(0)))
}
