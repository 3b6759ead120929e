//! The commands that talk to a running gateway through its API: `wsx status`, `wsx peers`,
//! `wsx sessions`, `wsx session kill`, `wsx bypass`, `wsx config`, `wsx log-level`.
//!
//! The API's address and token come from flags, then the environment (`WSX_API`,
//! `WSX_TOKEN`, `WSX_CACERT`), then the `[api]` section of the configuration file. Output is a
//! table for people, or the API's JSON with `--json`.

use crate::config::Loaded;
use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Subcommand, ValueEnum};
use serde::de::DeserializeOwned;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use wsx_api::model::{
    ConfigSummary, ConfigView, LogLevel, Peer, SessionPage, SessionPhase, SessionRoute, Shaper,
    Status,
};

/// Where the API is and how to authenticate, for the commands that ask a running gateway
/// (its address and token come from the configuration's `[api]` table unless given here).
#[derive(Debug, Clone, Args)]
pub(crate) struct ApiOptions {
    /// The API's base URL, e.g. `http://127.0.0.1:9180` [default: from the `[api]` table].
    #[arg(long, global = true, env = "WSX_API")]
    api: Option<String>,
    /// A bearer token [default: the `[api]` table's first].
    #[arg(long, global = true, env = "WSX_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A PEM certificate to trust for an HTTPS API (by default the `[api]` table's
    /// `tls_cert`).
    #[arg(long, global = true, env = "WSX_CACERT")]
    cacert: Option<PathBuf>,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum SessionCommand {
    /// Reset a session, both sides.
    Kill { id: u64 },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum OnOff {
    On,
    Off,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Print the running configuration (secrets masked).
    Show,
    /// Validate a file against the running gateway without applying it.
    Check { file: PathBuf },
    /// Apply a file as a reload would and save it as the gateway's configuration.
    Apply { file: PathBuf },
}

/// The API commands.
#[derive(Debug, Subcommand)]
pub(crate) enum ApiCommand {
    /// Version, uptime, peers' health, sessions and totals.
    Status {
        #[command(flatten)]
        options: ApiOptions,
    },
    /// Peers and their tunnels.
    Peers {
        #[command(flatten)]
        options: ApiOptions,
    },
    /// Live sessions.
    Sessions {
        /// Only sessions with this peer.
        #[arg(long)]
        peer: Option<String>,
        /// Only this route: tunnel, inbound, bypass.
        #[arg(long)]
        route: Option<String>,
        /// Only sessions whose client or destination is in this prefix or is this address.
        #[arg(long)]
        address: Option<String>,
        /// At most this many (1-1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Skip this many.
        #[arg(long, default_value_t = 0)]
        offset: u32,
        #[command(flatten)]
        options: ApiOptions,
    },
    /// Act on one session.
    Session {
        #[command(subcommand)]
        command: SessionCommand,
        #[command(flatten)]
        options: ApiOptions,
    },
    /// The shaper's scenarios with their live rates (measured over one second).
    Scenarios {
        /// Print again every second until interrupted.
        #[arg(long)]
        watch: bool,
        #[command(flatten)]
        options: ApiOptions,
    },
    /// The shaper's filters, in order, with the sessions each matched.
    Filters {
        #[command(flatten)]
        options: ApiOptions,
    },
    /// Force new sessions toward a peer to go direct (on) or through the tunnel (off).
    Bypass {
        state: OnOff,
        peer: String,
        #[command(flatten)]
        options: ApiOptions,
    },
    /// The running configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
        #[command(flatten)]
        options: ApiOptions,
    },
    /// Show the log filter, or set it (e.g. `debug`, `wsx_proxy=debug,info`).
    LogLevel {
        filter: Option<String>,
        #[command(flatten)]
        options: ApiOptions,
    },
}

impl ApiCommand {
    fn options(&self) -> &ApiOptions {
        match self {
            ApiCommand::Status { options }
            | ApiCommand::Peers { options }
            | ApiCommand::Sessions { options, .. }
            | ApiCommand::Session { options, .. }
            | ApiCommand::Scenarios { options, .. }
            | ApiCommand::Filters { options }
            | ApiCommand::Bypass { options, .. }
            | ApiCommand::Config { options, .. }
            | ApiCommand::LogLevel { options, .. } => options,
        }
    }
}

/// Runs `command` against the gateway whose configuration file is `config` (or the API
/// its options name).
pub(crate) fn run(command: ApiCommand, config: &Path) -> Result<()> {
    let options = command.options().clone();
    let client = Client::new(config, &options)?;
    let json = options.json;
    match command {
        ApiCommand::Status { .. } => {
            let (status, raw) = client.get::<Status>("/api/v1/status")?;
            print(json, &raw, || status_table(&status))
        }
        ApiCommand::Peers { .. } => {
            let (peers, raw) = client.get::<Vec<Peer>>("/api/v1/peers")?;
            print(json, &raw, || peers_table(&peers))
        }
        ApiCommand::Sessions {
            peer,
            route,
            address,
            limit,
            offset,
            ..
        } => {
            let mut query = vec![format!("limit={limit}"), format!("offset={offset}")];
            for (key, value) in [("peer", peer), ("route", route), ("address", address)] {
                if let Some(value) = value {
                    query.push(format!("{key}={}", encode(&value)));
                }
            }
            let path = format!("/api/v1/sessions?{}", query.join("&"));
            let (page, raw) = client.get::<SessionPage>(&path)?;
            print(json, &raw, || sessions_table(&page))
        }
        ApiCommand::Scenarios { watch, .. } => {
            // A reading's rates cover the time since the previous one a second old: read,
            // wait a second, read again.
            client.get::<Shaper>("/api/v1/shaper")?;
            loop {
                std::thread::sleep(Duration::from_secs(1));
                let (shaper, raw) = client.get::<Shaper>("/api/v1/shaper")?;
                print(json, &raw, || scenarios_table(&shaper))?;
                if !watch {
                    return Ok(());
                }
            }
        }
        ApiCommand::Filters { .. } => {
            let (shaper, raw) = client.get::<Shaper>("/api/v1/shaper")?;
            print(json, &raw, || filters_table(&shaper))
        }
        ApiCommand::Session {
            command: SessionCommand::Kill { id },
            ..
        } => {
            client.send("DELETE", &format!("/api/v1/sessions/{id}"), None)?;
            if !json {
                println!("session {id} reset");
            }
            Ok(())
        }
        ApiCommand::Bypass { state, peer, .. } => {
            let force = matches!(state, OnOff::On);
            let body = serde_json::json!({ "force": force }).to_string();
            let path = format!("/api/v1/peers/{}/bypass", encode(&peer));
            let raw = client.send("PUT", &path, Some(("application/json", body)))?;
            print(json, &raw, || {
                println!(
                    "{peer}: bypass {}",
                    if force { "forced" } else { "not forced" }
                )
            })
        }
        ApiCommand::Config {
            command: ConfigCommand::Show,
            ..
        } => {
            let (view, raw) = client.get::<ConfigView>("/api/v1/config")?;
            print(json, &raw, || {
                println!("# {}", view.path);
                println!(
                    "{}",
                    serde_json::to_string_pretty(&view.config).unwrap_or_default()
                );
            })
        }
        ApiCommand::Config {
            command: ConfigCommand::Check { file },
            ..
        } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let raw = client.send("POST", "/api/v1/config/check", Some(("text/plain", text)))?;
            let summary: ConfigSummary = parse(&raw)?;
            print(json, &raw, || {
                println!("{}: ok ({} peer(s))", file.display(), summary.peers)
            })
        }
        ApiCommand::Config {
            command: ConfigCommand::Apply { file },
            ..
        } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let raw = client.send("PUT", "/api/v1/config", Some(("text/plain", text)))?;
            let summary: ConfigSummary = parse(&raw)?;
            print(json, &raw, || {
                println!(
                    "{}: applied and saved ({} peer(s))",
                    file.display(),
                    summary.peers
                )
            })
        }
        ApiCommand::LogLevel { filter: None, .. } => {
            let (level, raw) = client.get::<LogLevel>("/api/v1/log-level")?;
            print(json, &raw, || println!("{}", level.filter))
        }
        ApiCommand::LogLevel {
            filter: Some(filter),
            ..
        } => {
            let body = serde_json::json!({ "filter": filter }).to_string();
            let raw = client.send("PUT", "/api/v1/log-level", Some(("application/json", body)))?;
            let level: LogLevel = parse(&raw)?;
            print(json, &raw, || println!("{}", level.filter))
        }
    }
}

fn print(json: bool, raw: &str, table: impl FnOnce()) -> Result<()> {
    if json {
        println!("{raw}");
    } else {
        table();
    }
    Ok(())
}

fn parse<T: DeserializeOwned>(raw: &str) -> Result<T> {
    serde_json::from_str(raw).context("the API's answer is not what this wsx expects")
}

/// Percent-encodes a query or path value.
fn encode(value: &str) -> String {
    let mut out = String::new();
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An HTTP client for the API.
struct Client {
    agent: ureq::Agent,
    base: String,
    token: Option<String>,
}

impl Client {
    fn new(config: &Path, c: &ApiOptions) -> Result<Self> {
        // The configuration file is optional when flags say everything.
        let loaded = match Loaded::read(config) {
            Ok(loaded) => Some(loaded),
            Err(e) if c.api.is_some() && c.token.is_some() => {
                let _ = e;
                None
            }
            Err(e) => {
                return Err(
                    e.context("reading the API's address and token (or give --api and --token)")
                );
            }
        };
        let api = loaded.as_ref().map(|l| l.api()).transpose()?.flatten();
        let base = match (&c.api, &api) {
            (Some(url), _) => url.trim_end_matches('/').to_owned(),
            (None, Some(api)) => {
                let scheme = if api.tls.is_some() { "https" } else { "http" };
                format!("{scheme}://{}", reachable(api.listen))
            }
            (None, None) => bail!(
                "{} has no [api] section: give --api (or WSX_API)",
                config.display()
            ),
        };
        let token = c
            .token
            .clone()
            .or_else(|| api.as_ref().and_then(|a| a.tokens.first().cloned()));
        let cacert = c.cacert.clone().or_else(|| {
            api.as_ref()
                .and_then(|a| a.tls.as_ref().map(|t| t.cert.clone()))
        });
        let mut config = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(60)))
            .http_status_as_error(false);
        if let Some(path) = cacert {
            let pem =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(cert)) => Some(cert),
                    _ => None,
                })
                .collect();
            if certs.is_empty() {
                bail!("{}: no certificate in it", path.display());
            }
            config = config.tls_config(
                ureq::tls::TlsConfig::builder()
                    .root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(certs)))
                    .build(),
            );
        }
        Ok(Self {
            agent: config.build().into(),
            base,
            token,
        })
    }

    fn get<T: DeserializeOwned>(&self, path: &str) -> Result<(T, String)> {
        let raw = self.send("GET", path, None)?;
        Ok((parse(&raw)?, raw))
    }

    /// Sends a request; an error answer becomes an error with the API's message.
    fn send(&self, method: &str, path: &str, body: Option<(&str, String)>) -> Result<String> {
        let url = format!("{}{path}", self.base);
        let mut request = ureq::http::Request::builder().method(method).uri(&url);
        if let Some(token) = &self.token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        let result = match body {
            Some((content_type, body)) => {
                let request = request
                    .header("Content-Type", content_type)
                    .body(body)
                    .context("building the request")?;
                self.agent.run(request)
            }
            None => {
                let request = request.body(()).context("building the request")?;
                self.agent.run(request)
            }
        };
        let mut response = result.with_context(|| format!("{method} {url}"))?;
        let status = response.status();
        let text = response
            .body_mut()
            .read_to_string()
            .with_context(|| format!("reading the answer to {method} {url}"))?;
        if status.is_success() {
            return Ok(text);
        }
        let message = serde_json::from_str::<wsx_api::error::ErrorBody>(&text)
            .map(|e| {
                let e = e.error;
                let at = match (e.line, e.column) {
                    (Some(l), Some(c)) => format!(" (line {l}, column {c})"),
                    _ => String::new(),
                };
                match e.field {
                    Some(field) => format!("{field}: {}{at}", e.message),
                    None => format!("{}{at}", e.message),
                }
            })
            .unwrap_or(text);
        Err(anyhow!("{status}: {message}"))
    }
}

/// The address to reach a listener on: a wildcard listener is reached on loopback.
fn reachable(listen: SocketAddr) -> String {
    let ip = match listen.ip() {
        std::net::IpAddr::V4(v4) if v4.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(v6) if v6.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port()).to_string()
}

// ---- Tables -------------------------------------------------------------------------------

/// Prints rows in columns as wide as their widest cell.
fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
}

fn status_table(s: &Status) {
    println!("wsx {}, up {}", s.version, human_duration(s.uptime_seconds));
    println!("public key      {}", s.public_key);
    println!("tunnel address  {}", s.tunnel_address);
    println!(
        "sessions        {} live ({} tunnel, {} inbound, {} bypass)",
        s.sessions.total, s.sessions.tunnel, s.sessions.inbound, s.sessions.bypass
    );
    if s.session_capacity > 0 {
        let short = if s.session_capacity < s.max_sessions {
            ": the open-file limit or the memory budget, not max_sessions, is the limit"
        } else {
            ""
        };
        println!(
            "capacity        {} sessions by the open-file limit and memory budget, max_sessions {}{short}",
            s.session_capacity, s.max_sessions
        );
    }
    let m = &s.memory;
    if m.budget > 0 {
        println!(
            "memory budget   {} MiB; relay buffers {:.1} of {} MiB lent, {} times refused",
            m.budget >> 20,
            m.relay_buffers_lent as f64 / f64::from(1 << 20),
            m.relay_buffers_budget >> 20,
            m.relay_buffers_refused
        );
    }
    if s.smb.sessions > 0 {
        let passed: Vec<String> = s
            .smb
            .passed_through
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(why, n)| format!("{n} {why}"))
            .collect();
        let passed = if passed.is_empty() {
            "none".to_owned()
        } else {
            passed.join(", ")
        };
        println!(
            "SMB             {} sessions watched, {} unsigned; passed through: {passed}",
            s.smb.sessions, s.smb.unsigned
        );
        if s.smb.reads > 0 {
            println!(
                "SMB reads       {} ({}), {} sent with no other READ in flight",
                s.smb.reads,
                human_bytes(s.smb.read_bytes),
                s.smb.reads_alone
            );
        }
        if s.smb.engine_sessions > 0 {
            println!(
                "SMB read-ahead  {} sessions; {} requests ahead ({}), {} missed ({}), {} files resumed; {} answered here, {} expired here; holding {}",
                s.smb.engine_sessions,
                s.smb.prefetched,
                human_bytes(s.smb.prefetched_bytes),
                s.smb.missed,
                human_bytes(s.smb.missed_bytes),
                s.smb.resumed,
                s.smb.answered_locally,
                s.smb.expired,
                human_bytes(s.smb.held_bytes)
            );
        }
    }
    let t = &s.totals;
    println!(
        "since start     {} opened, {} completed, {} reset, {} refused; {} from clients, {} from servers",
        t.sessions_opened.total,
        t.sessions_completed,
        t.sessions_reset,
        t.sessions_refused,
        human_bytes(t.bytes_from_clients),
        human_bytes(t.bytes_from_servers)
    );
    if !t.sessions_by_entry.is_empty() {
        let entries: Vec<String> = t
            .sessions_by_entry
            .iter()
            .map(|(entry, n)| format!("{n} {entry}"))
            .collect();
        println!("entered by      {}", entries.join(", "));
    }
    if !s.peers.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = s
            .peers
            .iter()
            .map(|p| {
                vec![
                    p.name.clone(),
                    if p.healthy { "up" } else { "down" }.into(),
                    if p.bypass_forced { "forced" } else { "-" }.into(),
                ]
            })
            .collect();
        table(&["PEER", "HEALTH", "BYPASS"], &rows);
    }
}

fn peers_table(peers: &[Peer]) {
    let rows: Vec<Vec<String>> = peers
        .iter()
        .map(|p| {
            let t = p.tunnel.as_ref();
            vec![
                p.name.clone(),
                if p.healthy { "up" } else { "down" }.into(),
                if p.bypass_forced { "forced" } else { "-" }.into(),
                t.map_or("-".into(), |t| t.remote.clone()),
                t.map_or("-".into(), |t| format!("{:.1}", t.rtt_seconds * 1e3)),
                t.map_or("-".into(), |t| human_rate(t.pacing_rate_bps)),
                t.map_or("-".into(), |t| format!("{:.2}", t.loss_ratio * 100.0)),
                t.map_or("-".into(), |t| format!("{:.1}", t.fec.overhead * 100.0)),
                t.map_or("-".into(), |t| t.fec.recovered_by_peer.to_string()),
                p.compression
                    .ratio_sent
                    .map_or("-".into(), |r| format!("{r:.3}")),
            ]
        })
        .collect();
    table(
        &[
            "PEER",
            "HEALTH",
            "BYPASS",
            "REMOTE",
            "RTT_MS",
            "RATE",
            "LOSS_%",
            "FEC_%",
            "REPAIRED",
            "WIRE/PLAIN",
        ],
        &rows,
    );
}

fn sessions_table(page: &SessionPage) {
    let rows: Vec<Vec<String>> = page
        .sessions
        .iter()
        .map(|s| {
            vec![
                s.id.to_string(),
                match s.route {
                    SessionRoute::Tunnel => "tunnel",
                    SessionRoute::Inbound => "inbound",
                    SessionRoute::Bypass => "bypass",
                    SessionRoute::Direct => "direct",
                }
                .into(),
                match s.state {
                    SessionPhase::Connecting => "connecting",
                    SessionPhase::Open => "open",
                    SessionPhase::HalfClosed => "half-closed",
                }
                .into(),
                s.entry.clone(),
                s.peer.clone().unwrap_or_else(|| "-".into()),
                s.client.clone(),
                s.destination.clone(),
                human_duration(s.age_seconds),
                human_bytes(s.bytes_from_client),
                human_bytes(s.bytes_from_server),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "ROUTE",
            "STATE",
            "ENTRY",
            "PEER",
            "CLIENT",
            "DESTINATION",
            "AGE",
            "FROM_CLIENT",
            "FROM_SERVER",
        ],
        &rows,
    );
    let shown = page.sessions.len() as u64;
    if shown < page.total {
        println!(
            "({shown} of {} shown from {}; --offset and --limit page)",
            page.total, page.offset
        );
    }
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn scenarios_table(shaper: &Shaper) {
    let rate = |r: Option<u64>| r.map_or("-".into(), human_rate);
    let mut rows: Vec<Vec<String>> = shaper
        .scenarios
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.parent.clone().unwrap_or_else(|| "-".into()),
                s.mode.clone(),
                s.priority.to_string(),
                rate(s.min_rate_bps),
                rate(s.max_rate_bps),
                human_rate(s.rate_bps as u64),
                format!("{}/{}", s.backlogged, s.flows),
                human_bytes(s.bytes),
                match s.min_met {
                    Some(true) => "met",
                    Some(false) => "NOT MET",
                    None => "-",
                }
                .into(),
                format!("{:.1}", s.held_at_max_seconds),
                s.discarded.to_string(),
            ]
        })
        .collect();
    rows.push(vec![
        "(wan)".into(),
        "-".into(),
        "-".into(),
        "-".into(),
        "-".into(),
        human_rate(shaper.wan_rate_bps),
        human_rate(shaper.rate_bps as u64),
        format!("-/{}", shaper.flows),
        human_bytes(shaper.bytes),
        "-".into(),
        "-".into(),
        "-".into(),
    ]);
    table(
        &[
            "SCENARIO",
            "PARENT",
            "MODE",
            "PRIO",
            "MIN",
            "MAX",
            "RATE",
            "BUSY/FLOWS",
            "SENT",
            "MIN",
            "AT_MAX_S",
            "DISCARDED",
        ],
        &rows,
    );
}

fn filters_table(shaper: &Shaper) {
    let mut rows: Vec<Vec<String>> = shaper
        .filters
        .iter()
        .enumerate()
        .map(|(i, f)| {
            vec![
                i.to_string(),
                f.scenario.clone(),
                f.matches.clone(),
                f.sessions.to_string(),
            ]
        })
        .collect();
    rows.push(vec![
        "-".into(),
        "default".into(),
        "(no filter matched)".into(),
        shaper.unmatched.to_string(),
    ]);
    table(&["#", "SCENARIO", "MATCHES", "SESSIONS"], &rows);
}

fn human_rate(bps: u64) -> String {
    match bps {
        0..1_000_000 => format!("{:.0} kbit/s", bps as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} Mbit/s", bps as f64 / 1e6),
        _ => format!("{:.2} Gbit/s", bps as f64 / 1e9),
    }
}

fn human_duration(seconds: f64) -> String {
    let s = seconds.max(0.0) as u64;
    match s {
        0..60 => format!("{seconds:.1}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(encode("10.1.0.0/16"), "10.1.0.0%2F16");
        assert_eq!(encode("fd00::1"), "fd00%3A%3A1");
        assert_eq!(encode("hq-1_a.b~"), "hq-1_a.b~");
    }

    #[test]
    fn wildcard_listeners_are_reached_on_loopback() {
        assert_eq!(
            reachable("0.0.0.0:9180".parse().unwrap_or_else(|e| panic!("{e}"))),
            "127.0.0.1:9180"
        );
        assert_eq!(
            reachable("[::]:9180".parse().unwrap_or_else(|e| panic!("{e}"))),
            "[::1]:9180"
        );
        assert_eq!(
            reachable("10.0.0.1:1".parse().unwrap_or_else(|e| panic!("{e}"))),
            "10.0.0.1:1"
        );
    }

    #[test]
    fn sizes_and_times_read_well() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 * 1024 * 1024), "3.0 MiB");
        assert_eq!(human_rate(94_200_000), "94.2 Mbit/s");
        assert_eq!(human_duration(3725.0), "1h02m");
    }
}
