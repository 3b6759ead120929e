//! The resources of the API as they travel: plain serde types with OpenAPI schemas, built
//! from the gateway's own status types.
//!
//! Rates are bits per second, byte counts are bytes, times are seconds (fractional) unless a
//! field's name says otherwise. Counters that belong to a tunnel start over when the peer's
//! tunnel is replaced; counters that belong to the gateway run from its start.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};
use wsx_proxy::{CompressionStats, GatewayTotals, PeerStatus, Route, SessionInfo, SessionState};
use wsx_tunnel::{ConnectionStats, FecStats};

/// `GET /api/v1/status`: the gateway at a glance.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Status {
    pub version: String,
    pub uptime_seconds: f64,
    /// The gateway's public key (base64), as peers configure it.
    pub public_key: String,
    /// The tunnel's UDP address.
    pub tunnel_address: String,
    pub peers: Vec<PeerHealth>,
    pub sessions: SessionCounts,
    /// The configured `max_sessions`, and how many sessions through the tunnel the open-file
    /// limit and the memory budget carry (one descriptor each; a session relayed directly
    /// holds two): beyond the smaller, new connections are bypassed (over `max_sessions`) or
    /// refused at once (at capacity).
    #[serde(default)]
    pub max_sessions: u64,
    #[serde(default)]
    pub session_capacity: u64,
    /// The configured `memory_budget` (bytes), and the relay buffers lent from it.
    #[serde(default)]
    pub memory: Memory,
    pub totals: Totals,
    /// What the SMB observers concluded about the sessions to port 445, since start.
    #[serde(default)]
    pub smb: Smb,
}

/// The SMB sessions in [`Status`]: every session to TCP port 445 through the tunnel of a
/// peer with `smb` on is judged as the relay copies it, and run through the read-ahead
/// engine when both gateways run it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct Smb {
    /// Sessions watched.
    pub sessions: u64,
    /// Sessions that connected a share with nothing signed or encrypted (one signed later
    /// counts here and under `passed_through.signed`).
    pub unsigned: u64,
    /// Sessions relayed byte for byte for good, by reason: `not_framed` (not SMB's Direct
    /// TCP framing), `smb1`, `dialect` (other than 2.0.2-3.1.1), `signed`, `encrypted`,
    /// `compressed`, `malformed`.
    pub passed_through: BTreeMap<String, u64>,
    /// READ requests in the sessions watched (until a session passed through), the bytes
    /// they asked for, and those sent while no other READ of their session was in flight:
    /// each of those waited a whole round trip, which is what read-ahead takes away.
    #[serde(default)]
    pub reads: u64,
    #[serde(default)]
    pub read_bytes: u64,
    #[serde(default)]
    pub reads_alone: u64,
    /// Sessions this gateway ran its half of the read-ahead engine on (both gateways run
    /// it when both can; far reads ahead for unsigned sessions).
    #[serde(default)]
    pub engine_sessions: u64,
    /// Requests this gateway (far) issued ahead of its peer's clients (READs and
    /// QUERY_INFOs), and the bytes the READs asked for.
    #[serde(default)]
    pub prefetched: u64,
    #[serde(default)]
    pub prefetched_bytes: u64,
    /// Client requests this gateway (near) answered itself, each a round trip saved: READs
    /// and QUERY_INFOs from what far sent ahead, and CLOSEs.
    #[serde(default)]
    pub answered_locally: u64,
    /// Predictions the client did not use, and their bytes: read for nothing.
    #[serde(default)]
    pub missed: u64,
    #[serde(default)]
    pub missed_bytes: u64,
    /// Answers this gateway (near) held past their validity window before the client
    /// asked (files others may write): those READs went to the server after all.
    #[serde(default)]
    pub expired: u64,
    /// Files this gateway (far) started reading ahead again after a miss.
    #[serde(default)]
    pub resumed: u64,
    /// Bytes the engine holds now, all sessions together.
    #[serde(default)]
    pub held_bytes: u64,
}

impl Smb {
    pub fn new(s: &wsx_proxy::SmbStats) -> Self {
        Self {
            sessions: s.sessions,
            unsigned: s.unsigned,
            passed_through: s
                .passed_through
                .iter()
                .map(|&(name, n)| (name.to_owned(), n))
                .collect(),
            reads: s.reads,
            read_bytes: s.read_bytes,
            reads_alone: s.reads_alone,
            engine_sessions: s.engine_sessions,
            prefetched: s.prefetched,
            prefetched_bytes: s.prefetched_bytes,
            answered_locally: s.answered_locally,
            missed: s.missed,
            missed_bytes: s.missed_bytes,
            expired: s.expired,
            resumed: s.resumed,
            held_bytes: s.held_bytes,
        }
    }
}

/// The memory budget in [`Status`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct Memory {
    pub budget: u64,
    /// The part large relay buffers are lent from, what is lent now, and how often a session
    /// went on with its small buffer because that part was spent.
    pub relay_buffers_budget: u64,
    pub relay_buffers_lent: u64,
    pub relay_buffers_refused: u64,
}

/// A peer's health in [`Status`].
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PeerHealth {
    pub name: String,
    /// A tunnel is established and the peer was heard from within the health timeout.
    pub healthy: bool,
    /// New sessions toward the peer's prefixes go direct (configured, or set through the API).
    pub bypass_forced: bool,
}

/// Sessions by route: live ones in [`Status`], opened ones in [`Totals`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct SessionCounts {
    pub total: u64,
    pub tunnel: u64,
    pub inbound: u64,
    pub bypass: u64,
    pub direct: u64,
}

/// What the gateway did since it started.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Totals {
    /// Sessions opened, by route.
    pub sessions_opened: SessionCounts,
    /// Sessions opened, by entry point: `intercepted`, `forward:NAME`, `socks:NAME` (each
    /// listener) and `tunnel` (opened by a peer); only those that have had one.
    pub sessions_by_entry: BTreeMap<String, u64>,
    /// Sessions that ended: both directions finished.
    pub sessions_completed: u64,
    /// Sessions reset: an end (client or server) reset its connection, a side failed, idle
    /// timeout, killed, or shut down.
    pub sessions_reset: u64,
    /// Connections refused: session limit, peer down with `on_failure = "reject"`, or the
    /// server could not be reached.
    pub sessions_refused: u64,
    /// Session bytes read from clients and from servers, all routes.
    pub bytes_from_clients: u64,
    pub bytes_from_servers: u64,
}

/// `GET /api/v1/peers/{name}`: a peer gateway and the tunnel to it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Peer {
    pub name: String,
    /// Where this gateway connects to the peer (none: the peer connects here).
    pub endpoint: Option<String>,
    /// Destination prefixes carried to the peer.
    pub prefixes: Vec<String>,
    pub healthy: bool,
    pub bypass_forced: bool,
    /// Established tunnels (one per side that connected).
    pub tunnels: u64,
    /// The tunnel in use, if the peer is healthy.
    pub tunnel: Option<Tunnel>,
    /// Compression of the sessions with the peer since the gateway started.
    pub compression: Compression,
}

/// The tunnel in use to a peer. Its counters start with the tunnel.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Tunnel {
    /// The peer's UDP address.
    pub remote: String,
    pub rtt_seconds: f64,
    pub min_rtt_seconds: f64,
    /// The UDP payload size the tunnel's packets are built to now: what path MTU discovery
    /// found the path carries (1472 on a 1500-byte IPv4 path), within `max_datagram`.
    pub datagram_bytes: u64,
    /// Times full-size packets stopped getting through and the size fell back to 1200.
    pub mtu_black_holes: u64,
    /// The AEAD sealing the tunnel's packets: `aes-256-gcm` when both gateways have AES
    /// instructions and allow it, `chacha20-poly1305` otherwise.
    pub cipher: Option<String>,
    /// The congestion controller's phase (e.g. `rapid-start`, `optimal`).
    pub congestion_phase: Option<String>,
    /// The rate the tunnel paces at, and its estimate of the bottleneck.
    pub pacing_rate_bps: u64,
    pub bottleneck_rate_bps: u64,
    pub packets_sent: u64,
    /// Packets that carried stream data, control messages or PINGs: the denominator of the
    /// FEC overhead.
    pub data_packets_sent: u64,
    /// Packets that carried only ACKs. Data and ACK-only packets are the ones tracked for
    /// loss (parity packets and the handshake are not).
    pub ack_only_packets_sent: u64,
    pub bytes_sent: u64,
    /// Packets received, including those rebuilt from the peer's parity (parity packets are
    /// counted in `fec.parity_received`).
    pub packets_received: u64,
    pub bytes_received: u64,
    /// Tracked packets declared lost; the data in them was sent again. Those the peer
    /// rebuilt from parity in time are acknowledged instead and counted in
    /// `fec.recovered_by_peer`: the path lost `packets_lost + fec.recovered_by_peer`.
    pub packets_lost: u64,
    /// The share of tracked packets the path lost, before FEC repair:
    /// `(packets_lost + fec.recovered_by_peer) / (data_packets_sent + ack_only_packets_sent)`.
    /// Comparable with a link's own loss count, in both directions.
    pub loss_ratio: f64,
    /// The share of tracked packets lost and not rebuilt by the peer:
    /// `packets_lost / (data_packets_sent + ack_only_packets_sent)`.
    pub unrepaired_loss_ratio: f64,
    /// Datagrams dropped as forged or replayed.
    pub auth_failures: u64,
    pub replays: u64,
    pub fec: Fec,
}

/// Forward error correction on a tunnel.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Fec {
    pub blocks: u64,
    pub packets_protected: u64,
    pub parity_sent: u64,
    pub parity_bytes_sent: u64,
    /// Parity packets per data packet sent.
    pub overhead: f64,
    /// Our losses the peer rebuilt from parity: retransmissions avoided.
    pub recovered_by_peer: u64,
    pub parity_received: u64,
    /// The peer's losses rebuilt here.
    pub recovered: u64,
    /// Groups of the peer's packets, received here, that lost more than their parity could
    /// rebuild.
    pub unrecoverable_groups: u64,
    /// Bytes held for rebuilding the peer's losses (copies of its protected packets, parity).
    pub decoder_bytes: u64,
}

/// Deflate on the streams to and from a peer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Compression {
    /// Session bytes sent, and the stream bytes they took.
    pub plain_sent: u64,
    pub wire_sent: u64,
    /// `wire_sent / plain_sent` (below 1 is a gain); none before any data.
    pub ratio_sent: Option<f64>,
    pub chunks_deflated: u64,
    pub chunks_incompressible: u64,
    pub chunks_stored: u64,
    pub compress_cpu_seconds: f64,
    pub wire_received: u64,
    pub plain_received: u64,
    pub inflate_cpu_seconds: f64,
}

/// How a session is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionRoute {
    /// Intercepted here and carried through the tunnel.
    Tunnel,
    /// Arrived through the tunnel and re-originated here.
    Inbound,
    /// Intercepted here and connected directly (the peer down or bypass forced).
    Bypass,
    /// Relayed directly by its scenario's mode (aggregate, fixed) and shaped here.
    Direct,
}

/// Where a session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SessionPhase {
    Connecting,
    Open,
    HalfClosed,
}

/// `GET /api/v1/sessions/{id}`: one relayed TCP connection.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Session {
    pub id: u64,
    pub client: String,
    /// An address, or `name:port` for a forwarding listener's name target.
    pub destination: String,
    /// Where it entered this gateway: `intercepted`, `forward:NAME`, `socks:NAME`, or
    /// `tunnel` (opened by the peer).
    pub entry: String,
    /// The peer gateway the session goes to or came from (none: bypass with no peer).
    pub peer: Option<String>,
    pub route: SessionRoute,
    pub state: SessionPhase,
    pub age_seconds: f64,
    pub idle_seconds: f64,
    pub bytes_from_client: u64,
    pub bytes_from_server: u64,
}

/// Filters and paging of `GET /api/v1/sessions`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SessionQuery {
    /// Only sessions with this peer.
    pub peer: Option<String>,
    pub route: Option<SessionRoute>,
    pub state: Option<SessionPhase>,
    /// Only sessions whose client or destination address is in this prefix (`10.1.0.0/16`)
    /// or is this address.
    pub address: Option<String>,
    /// At most this many (default 100, at most 1,000).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// Skip this many of the matching sessions (ordered by id).
    #[param(minimum = 0, maximum = 2147483647)]
    pub offset: Option<u32>,
}

/// A page of sessions.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionPage {
    /// Sessions matching the filters, all pages.
    pub total: u64,
    pub offset: u32,
    pub limit: u32,
    pub sessions: Vec<Session>,
}

/// `PUT /api/v1/peers/{name}/bypass`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Bypass {
    /// Send new sessions toward the peer's prefixes direct (`true`), or through the tunnel
    /// again (`false`). Holds until the configuration is next applied or reloaded.
    pub force: bool,
}

/// `GET /api/v1/config`: the running configuration.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ConfigView {
    /// The file it was read from, and is written to by `PUT /api/v1/config`.
    pub path: String,
    /// Every setting, defaults included; secrets read `<secret>`.
    #[schema(value_type = Object)]
    pub config: serde_json::Value,
}

/// What a valid configuration holds.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ConfigSummary {
    pub peers: u64,
    pub interception: bool,
    /// Whether the configuration is now running (false for a check).
    pub applied: bool,
}

/// `GET`/`PUT /api/v1/log-level`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LogLevel {
    /// A tracing filter: `info`, `debug`, `wsx_proxy=debug,info`, …
    pub filter: String,
}

/// `GET /api/v1/health`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Always `ok`: the daemon answers.
    pub status: String,
}

impl Peer {
    pub(crate) fn new(p: &PeerStatus) -> Self {
        Self {
            name: p.name.clone(),
            endpoint: p.endpoint.map(|e| e.to_string()),
            prefixes: p.prefixes.iter().map(ToString::to_string).collect(),
            healthy: p.healthy,
            bypass_forced: p.force_bypass,
            tunnels: p.tunnels as u64,
            tunnel: p
                .tunnel
                .as_ref()
                .map(|t| Tunnel::new(&t.remote.to_string(), &t.stats)),
            compression: Compression::new(&p.compression),
        }
    }
}

impl Tunnel {
    fn new(remote: &str, s: &ConnectionStats) -> Self {
        let congestion = s.congestion;
        Self {
            remote: remote.to_owned(),
            rtt_seconds: s.smoothed_rtt.as_secs_f64(),
            min_rtt_seconds: s.min_rtt.as_secs_f64(),
            datagram_bytes: u64::from(s.datagram_size),
            mtu_black_holes: s.mtu.black_holes,
            cipher: s.cipher.map(|c| c.as_str().to_owned()),
            congestion_phase: congestion.map(|c| c.phase.to_owned()),
            pacing_rate_bps: congestion.map_or(0, |c| c.pacing_rate.saturating_mul(8)),
            bottleneck_rate_bps: congestion.map_or(0, |c| c.bottleneck_rate.saturating_mul(8)),
            packets_sent: s.packets_sent,
            data_packets_sent: s.eliciting_sent,
            ack_only_packets_sent: s.ack_only_sent,
            bytes_sent: s.bytes_sent,
            packets_received: s.packets_received,
            bytes_received: s.bytes_received,
            packets_lost: s.packets_lost,
            loss_ratio: s.loss_ratio(),
            unrepaired_loss_ratio: s.unrepaired_loss_ratio(),
            auth_failures: s.auth_failures,
            replays: s.replays,
            fec: Fec::new(&s.fec, s.eliciting_sent),
        }
    }
}

impl Fec {
    fn new(f: &FecStats, data_packets: u64) -> Self {
        Self {
            blocks: f.blocks,
            packets_protected: f.packets_protected,
            parity_sent: f.parity_sent,
            parity_bytes_sent: f.parity_bytes_sent,
            overhead: ratio(f.parity_sent, data_packets),
            recovered_by_peer: f.recovered_by_peer,
            parity_received: f.parity_received,
            recovered: f.recovered,
            unrecoverable_groups: f.unrecoverable_groups,
            decoder_bytes: f.decoder_bytes,
        }
    }
}

impl Compression {
    fn new(c: &CompressionStats) -> Self {
        Self {
            plain_sent: c.plain_sent,
            wire_sent: c.wire_sent,
            ratio_sent: c.ratio_sent(),
            chunks_deflated: c.chunks_deflated,
            chunks_incompressible: c.chunks_incompressible,
            chunks_stored: c.chunks_stored,
            compress_cpu_seconds: c.compress_time.as_secs_f64(),
            wire_received: c.wire_received,
            plain_received: c.plain_received,
            inflate_cpu_seconds: c.inflate_time.as_secs_f64(),
        }
    }
}

impl SessionRoute {
    pub(crate) fn new(route: Route) -> Self {
        match route {
            Route::Tunnel => Self::Tunnel,
            Route::Inbound => Self::Inbound,
            Route::Direct => Self::Direct,
            // Route is non-exhaustive: a route added later shows as a bypass until the API
            // learns it.
            _ => Self::Bypass,
        }
    }
}

impl SessionPhase {
    fn new(state: SessionState) -> Self {
        match state {
            SessionState::Connecting => Self::Connecting,
            SessionState::Open => Self::Open,
            _ => Self::HalfClosed,
        }
    }
}

impl Session {
    pub(crate) fn new(s: &SessionInfo) -> Self {
        Self {
            id: s.id,
            client: s.client.0.to_string(),
            destination: s.destination.to_string(),
            entry: s.entry.to_string(),
            peer: s.peer.clone(),
            route: SessionRoute::new(s.route),
            state: SessionPhase::new(s.state),
            age_seconds: s.age.as_secs_f64(),
            idle_seconds: s.idle.as_secs_f64(),
            bytes_from_client: s.bytes_from_client,
            bytes_from_server: s.bytes_from_server,
        }
    }
}

impl SessionCounts {
    pub(crate) fn add(&mut self, route: SessionRoute, n: u64) {
        self.total += n;
        match route {
            SessionRoute::Tunnel => self.tunnel += n,
            SessionRoute::Inbound => self.inbound += n,
            SessionRoute::Bypass => self.bypass += n,
            SessionRoute::Direct => self.direct += n,
        }
    }
}

impl Totals {
    pub(crate) fn new(t: &GatewayTotals) -> Self {
        let mut opened = SessionCounts::default();
        for (route, n) in &t.opened {
            opened.add(SessionRoute::new(*route), *n);
        }
        Self {
            sessions_opened: opened,
            sessions_by_entry: t
                .opened_by_entry
                .iter()
                .map(|(entry, n)| (entry.to_string(), *n))
                .collect(),
            sessions_completed: t.completed,
            sessions_reset: t.reset + t.failed + t.idle + t.killed + t.shutdown,
            sessions_refused: t.refused_limit + t.refused_peer_down + t.connect_failed,
            bytes_from_clients: t.traffic.iter().map(|x| x.from_client).sum(),
            bytes_from_servers: t.traffic.iter().map(|x| x.from_server).sum(),
        }
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// `GET /api/v1/shaper`: the bandwidth controller, its scenarios and filters, with live
/// rates.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Shaper {
    /// What the scenarios divide, bits per second.
    pub wan_rate_bps: u64,
    /// Bytes sent by every shaped flow since the gateway started.
    pub bytes: u64,
    /// Bits per second since the previous reading at least a second old.
    pub rate_bps: f64,
    pub flows: u64,
    pub scenarios: Vec<Scenario>,
    /// The filters, in the configuration's order (the first that matches a session wins).
    pub filters: Vec<Filter>,
    /// Sessions no filter matched (they went to the `default` scenario).
    pub unmatched: u64,
}

/// A filter and the sessions it matched.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Filter {
    pub scenario: String,
    /// What it matches, as `field=value,...` pairs (`any`: everything).
    pub matches: String,
    pub sessions: u64,
}

/// One scenario: its settings and counters.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Scenario {
    pub name: String,
    pub parent: Option<String>,
    /// `accelerate`, `aggregate`, `fixed` or `discard`.
    pub mode: String,
    pub min_rate_bps: Option<u64>,
    pub max_rate_bps: Option<u64>,
    pub flow_rate_bps: Option<u64>,
    pub priority: u8,
    pub dscp: Option<u8>,
    /// Bytes its flows sent (an interior scenario: its subtree's).
    pub bytes: u64,
    pub flows: u64,
    /// Flows with something to send now.
    pub backlogged: u64,
    /// Bits per second, as the shaper's `rate_bps`.
    pub rate_bps: f64,
    /// Seconds its maximum held it back.
    pub held_at_max_seconds: f64,
    /// Whether it gets its minimum (within 1 %); absent without a minimum or while idle.
    pub min_met: Option<bool>,
    /// Sessions it refused (discard scenarios).
    pub discarded: u64,
}

impl Shaper {
    pub(crate) fn new(s: &wsx_proxy::ShaperStatus) -> Self {
        Self {
            wan_rate_bps: s.wan_rate.bits_per_second(),
            bytes: s.bytes,
            rate_bps: s.rate,
            flows: s.flows,
            scenarios: s.scenarios.iter().map(Scenario::new).collect(),
            filters: s
                .filters
                .iter()
                .map(|f| Filter {
                    scenario: f.scenario.clone(),
                    matches: f.matches.clone(),
                    sessions: f.sessions,
                })
                .collect(),
            unmatched: s.unmatched,
        }
    }
}

impl Scenario {
    fn new(s: &wsx_proxy::ScenarioStatus) -> Self {
        let bps = |r: Option<wsx_proxy::wsx_shaper::Rate>| r.map(|r| r.bits_per_second());
        let spec = &s.spec;
        Self {
            name: spec.name.clone(),
            parent: spec.parent.clone(),
            mode: spec.mode.as_str().to_owned(),
            min_rate_bps: bps(spec.min_rate),
            max_rate_bps: bps(spec.max_rate),
            flow_rate_bps: bps(spec.flow_rate),
            priority: spec.priority,
            dscp: spec.dscp,
            bytes: s.bytes,
            flows: s.flows,
            backlogged: s.backlogged,
            rate_bps: s.rate,
            held_at_max_seconds: s.held_at_max.as_secs_f64(),
            min_met: s.min_met,
            discarded: s.discarded,
        }
    }
}

/// `PUT /api/v1/shaper/scenarios/{name}`: a scenario's fields, as in the configuration
/// file's `[[scenario]]` (the name is the path's). Rates are written as in the file:
/// `"20 Mbit/s"`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScenarioBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// `accelerate` (the default), `aggregate`, `fixed` or `discard`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_rate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_rate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_kib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dscp: Option<u8>,
}

/// `POST /api/v1/shaper/filters`, `PUT /api/v1/shaper/filters/{index}`: a filter's fields,
/// as in the configuration file's `[[filter]]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FilterBody {
    pub scenario: String,
    /// Prefixes or addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source: Vec<String>,
    /// Names of address lists.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_list: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destination: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destination_list: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_port: Vec<PortSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destination_port: Vec<PortSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dscp: Vec<u8>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interface: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peer: Vec<String>,
}

/// A port (`445`) or a range (`"8000-8080"`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum PortSpec {
    Port(u16),
    Range(String),
}

/// An edit of the shaper's part of the configuration file, made by the daemon on the file
/// and applied like a new file ([`crate::Control::edit_shaper`]).
#[derive(Debug, Clone, PartialEq)]
pub enum ShaperEdit {
    /// Adds the scenario `name`, or replaces its fields.
    PutScenario {
        name: String,
        fields: serde_json::Map<String, serde_json::Value>,
    },
    DeleteScenario {
        name: String,
    },
    /// Inserts a filter at position `at` (0 first; `None`: last).
    AddFilter {
        at: Option<usize>,
        fields: serde_json::Map<String, serde_json::Value>,
    },
    /// Replaces the filter at `index`.
    PutFilter {
        index: usize,
        fields: serde_json::Map<String, serde_json::Value>,
    },
    DeleteFilter {
        index: usize,
    },
}
