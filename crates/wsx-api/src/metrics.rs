//! Prometheus metrics, read from the gateway at each scrape.
//!
//! A [`Collector`] walks the gateway's status (peers, tunnels, sessions, totals) when
//! Prometheus asks, so the data path keeps only the plain counters it has anyway. Names
//! follow the Prometheus conventions; counters end in `_total`. Tunnel counters belong to
//! the tunnel in use and start over when it is replaced, which Prometheus reads as a
//! counter reset.
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `wsx_info` | `version` | 1 |
//! | `wsx_uptime_seconds` | | since the gateway started |
//! | `wsx_session_capacity`, `wsx_max_sessions` | | sessions the open-file limit and memory budget carry, and the configured limit |
//! | `wsx_memory_budget_bytes`, `wsx_relay_buffer_budget_bytes`, `wsx_relay_buffer_lent_bytes` | | the memory budget, its part for relay buffers, and what is lent now |
//! | `wsx_relay_buffers_refused_total` | | sessions that went on with their small buffer because the relay buffers' part was spent |
//! | `wsx_sessions` | `route` | live sessions |
//! | `wsx_sessions_opened_total` | `route` | |
//! | `wsx_sessions_entered_total` | `entry`, `listener` | opened, by entry point: `intercepted`, `forward`, `socks` (with the listener's name), `tunnel` |
//! | `wsx_sessions_ended_total` | `outcome` | `completed`, `reset` (by an end), `failed`, `idle`, `killed`, `shutdown` |
//! | `wsx_sessions_refused_total` | `reason` | `limit`, `peer_down`, `connect_failed` |
//! | `wsx_session_bytes_total` | `peer`, `route`, `direction` | read from clients / servers |
//! | `wsx_smb_sessions_total` | | sessions to TCP 445 watched as SMB |
//! | `wsx_smb_unsigned_total` | | of those, connected to a share with nothing signed or encrypted so far (one signed later counts here and under `passed_through`) |
//! | `wsx_smb_reads_total`, `wsx_smb_read_bytes_total`, `wsx_smb_reads_alone_total` | | READs in the sessions watched (until a session passed through), the bytes asked, and those sent with no other READ of their session in flight |
//! | `wsx_smb_engine_sessions_total` | | sessions this gateway ran its half of the read-ahead engine on |
//! | `wsx_smb_prefetched_total`, `wsx_smb_prefetched_bytes_total` | | requests far issued ahead of its peer's clients (READs, QUERY_INFOs), and the READs' bytes |
//! | `wsx_smb_answered_locally_total` | | client requests near answered itself: READs and QUERY_INFOs from what far sent ahead, and CLOSEs |
//! | `wsx_smb_missed_total`, `wsx_smb_missed_bytes_total` | | predictions the client did not use, and their bytes |
//! | `wsx_smb_expired_total` | | answers near held past their validity window (files others may write) before the client asked |
//! | `wsx_smb_resumed_total` | | files far read ahead again after a miss |
//! | `wsx_smb_held_bytes` | | bytes the engine holds now, all sessions |
//! | `wsx_smb_passed_through_total` | `reason` | relayed byte for byte for good: `not_framed`, `smb1`, `dialect`, `signed`, `encrypted`, `compressed`, `malformed` |
//! | `wsx_peer_up` | `peer` | 1 when a tunnel is established and the peer heard from |
//! | `wsx_peer_bypass_forced` | `peer` | |
//! | `wsx_peer_tunnels` | `peer` | established tunnels |
//! | `wsx_tunnel_rtt_seconds`, `wsx_tunnel_min_rtt_seconds` | `peer` | |
//! | `wsx_tunnel_datagram_bytes` | `peer` | UDP payload size the packets are built to (path MTU discovery) |
//! | `wsx_tunnel_pacing_rate_bytes_per_second`, `wsx_tunnel_bottleneck_rate_bytes_per_second` | `peer` | |
//! | `wsx_tunnel_packets_sent_total`, `_packets_received_total` | `peer` | |
//! | `wsx_tunnel_packets_tracked_total`, `_packets_lost_total` | `peer` | data and ACK-only packets sent; those of them lost and not rebuilt |
//! | `wsx_tunnel_bytes_sent_total`, `_bytes_received_total` | `peer` | |
//! | `wsx_tunnel_auth_failures_total`, `_replays_total` | `peer` | datagrams dropped |
//! | `wsx_fec_packets_protected_total`, `_parity_sent_total`, `_parity_bytes_sent_total` | `peer` | |
//! | `wsx_fec_recovered_by_peer_total`, `_recovered_total`, `_unrecoverable_groups_total` | `peer` | |
//! | `wsx_fec_decoder_bytes` | `peer` | memory held for rebuilding the peer's losses |
//! | `wsx_compression_plain_bytes_total`, `_wire_bytes_total` | `peer`, `direction` | `sent`, `received` |
//! | `wsx_compression_chunks_total` | `peer`, `kind` | `deflated`, `incompressible`, `stored` |
//! | `wsx_compression_cpu_seconds_total` | `peer`, `operation` | `compress`, `inflate` |

use crate::Control;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use wsx_proxy::Route;

/// The content type of the metrics the API serves (OpenMetrics text).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A registry with the gateway's collector.
pub(crate) struct Exporter {
    registry: Registry,
}

impl Exporter {
    pub(crate) fn new(control: Arc<dyn Control>) -> Self {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(GatewayCollector(control)));
        Self { registry }
    }

    /// The metrics as OpenMetrics text.
    pub(crate) fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

struct GatewayCollector(Arc<dyn Control>);

impl std::fmt::Debug for GatewayCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GatewayCollector")
    }
}

type Labels = Vec<(&'static str, String)>;

/// Reads one counter of a tunnel.
type Read = fn(&wsx_tunnel::ConnectionStats) -> u64;

/// One metric family: its descriptor, then one sample per label set.
fn family<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, M)>,
) -> Result<(), std::fmt::Error> {
    let mut samples = samples.into_iter().peekable();
    let Some((_, first)) = samples.peek() else {
        return Ok(());
    };
    let mut metric = encoder.encode_descriptor(name, help, None, first.metric_type())?;
    for (labels, sample) in samples {
        sample.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

fn counter(labels: Labels, value: u64) -> (Labels, ConstCounter<u64>) {
    (labels, ConstCounter::new(value))
}

fn gauge(labels: Labels, value: f64) -> (Labels, ConstGauge<f64>) {
    (labels, ConstGauge::new(value))
}

fn peer(name: &str) -> Labels {
    vec![("peer", name.to_owned())]
}

fn with(mut labels: Labels, key: &'static str, value: &str) -> Labels {
    labels.push((key, value.to_owned()));
    labels
}

impl Collector for GatewayCollector {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let gateway = self.0.gateway();
        let totals = gateway.totals();
        let peers = gateway.peers();
        let routes = Route::ALL;

        family(
            &mut e,
            "wsx_info",
            "The running wsx",
            [gauge(
                vec![("version", env!("CARGO_PKG_VERSION").to_owned())],
                1.0,
            )],
        )?;
        family(
            &mut e,
            "wsx_uptime_seconds",
            "Seconds since the gateway started",
            [gauge(vec![], totals.uptime.as_secs_f64())],
        )?;
        family(
            &mut e,
            "wsx_session_capacity",
            "Sessions the open-file limit and the memory budget carry (beyond, new ones are refused at once)",
            [gauge(vec![], gateway.session_capacity() as f64)],
        )?;
        let memory = gateway.memory();
        family(
            &mut e,
            "wsx_memory_budget_bytes",
            "The configured memory_budget",
            [gauge(vec![], memory.budget as f64)],
        )?;
        family(
            &mut e,
            "wsx_relay_buffer_budget_bytes",
            "The part of the memory budget large relay buffers are lent from",
            [gauge(vec![], memory.relay_buffers_budget as f64)],
        )?;
        family(
            &mut e,
            "wsx_relay_buffer_lent_bytes",
            "Large relay buffers lent to sessions now",
            [gauge(vec![], memory.relay_buffers_lent as f64)],
        )?;
        family(
            &mut e,
            "wsx_relay_buffers_refused_total",
            "Times a session went on with its small buffer because the relay buffers' part was spent",
            [counter(vec![], memory.relay_buffers_refused)],
        )?;
        family(
            &mut e,
            "wsx_max_sessions",
            "The configured max_sessions (beyond, new sessions bypass the tunnel)",
            [gauge(vec![], gateway.max_sessions() as f64)],
        )?;
        family(
            &mut e,
            "wsx_sessions",
            "Live sessions",
            routes.map(|r| {
                let n = totals
                    .live
                    .iter()
                    .find(|(route, _)| *route == r)
                    .map_or(0, |(_, n)| *n);
                gauge(vec![("route", r.as_str().to_owned())], n as f64)
            }),
        )?;
        family(
            &mut e,
            "wsx_sessions_opened",
            "Sessions opened",
            routes.map(|r| {
                let n = totals
                    .opened
                    .iter()
                    .find(|(route, _)| *route == r)
                    .map_or(0, |(_, n)| *n);
                counter(vec![("route", r.as_str().to_owned())], n)
            }),
        )?;
        family(
            &mut e,
            "wsx_sessions_entered",
            "Sessions opened, by entry point",
            totals.opened_by_entry.iter().map(|(entry, n)| {
                let labels = vec![
                    ("entry", entry.kind().to_owned()),
                    ("listener", entry.listener().unwrap_or_default().to_owned()),
                ];
                counter(labels, *n)
            }),
        )?;
        family(
            &mut e,
            "wsx_sessions_ended",
            "Sessions ended, by how",
            [
                ("completed", totals.completed),
                ("reset", totals.reset),
                ("failed", totals.failed),
                ("idle", totals.idle),
                ("killed", totals.killed),
                ("shutdown", totals.shutdown),
            ]
            .map(|(outcome, n)| counter(vec![("outcome", outcome.to_owned())], n)),
        )?;
        family(
            &mut e,
            "wsx_sessions_refused",
            "Connections not relayed as asked: over the session limit, peer down with \
             on_failure = reject, the server unreachable, or a discard scenario",
            [
                ("limit", totals.refused_limit),
                ("peer_down", totals.refused_peer_down),
                ("connect_failed", totals.connect_failed),
                ("discarded", totals.discarded),
            ]
            .map(|(reason, n)| counter(vec![("reason", reason.to_owned())], n)),
        )?;
        let smb = gateway.smb();
        family(
            &mut e,
            "wsx_smb_sessions",
            "Sessions to TCP port 445 watched as SMB",
            [counter(vec![], smb.sessions)],
        )?;
        family(
            &mut e,
            "wsx_smb_unsigned",
            "SMB sessions that connected a share with nothing signed or encrypted so far (one passed through later counts here too)",
            [counter(vec![], smb.unsigned)],
        )?;
        for (name, help, value) in [
            (
                "wsx_smb_reads",
                "READ requests in the SMB sessions watched, until a session passed through",
                smb.reads,
            ),
            (
                "wsx_smb_read_bytes",
                "Bytes those READ requests asked for",
                smb.read_bytes,
            ),
            (
                "wsx_smb_reads_alone",
                "READs sent while no other READ of their session was in flight (each waits a round trip)",
                smb.reads_alone,
            ),
            (
                "wsx_smb_engine_sessions",
                "SMB sessions this gateway ran its half of the read-ahead engine on",
                smb.engine_sessions,
            ),
            (
                "wsx_smb_prefetched",
                "READs this gateway issued ahead of its peer's SMB clients",
                smb.prefetched,
            ),
            (
                "wsx_smb_prefetched_bytes",
                "Bytes those READs asked for",
                smb.prefetched_bytes,
            ),
            (
                "wsx_smb_answered_locally",
                "Client READs this gateway answered from what its peer read ahead",
                smb.answered_locally,
            ),
            (
                "wsx_smb_missed",
                "Predicted READs the client did not use",
                smb.missed,
            ),
            (
                "wsx_smb_missed_bytes",
                "Bytes those predictions asked for, read for nothing",
                smb.missed_bytes,
            ),
            (
                "wsx_smb_expired",
                "Answers held past their validity window before the client asked",
                smb.expired,
            ),
            (
                "wsx_smb_resumed",
                "Files read ahead again after a miss",
                smb.resumed,
            ),
        ] {
            family(&mut e, name, help, [counter(vec![], value)])?;
        }
        family(
            &mut e,
            "wsx_smb_held_bytes",
            "Bytes the SMB engine holds now, all sessions together",
            [gauge(vec![], smb.held_bytes as f64)],
        )?;
        family(
            &mut e,
            "wsx_smb_passed_through",
            "SMB sessions relayed byte for byte for good, by reason",
            smb.passed_through
                .iter()
                .map(|&(reason, n)| counter(vec![("reason", reason.to_owned())], n)),
        )?;
        family(
            &mut e,
            "wsx_session_bytes",
            "Session bytes read from clients and from servers",
            totals.traffic.iter().flat_map(|t| {
                let labels = vec![
                    ("peer", t.peer.clone().unwrap_or_default()),
                    ("route", t.route.as_str().to_owned()),
                ];
                [
                    counter(
                        with(labels.clone(), "direction", "from_client"),
                        t.from_client,
                    ),
                    counter(with(labels, "direction", "from_server"), t.from_server),
                ]
            }),
        )?;

        family(
            &mut e,
            "wsx_peer_up",
            "1 when a tunnel to the peer is established and the peer was heard from",
            peers
                .iter()
                .map(|p| gauge(peer(&p.name), f64::from(u8::from(p.healthy)))),
        )?;
        family(
            &mut e,
            "wsx_peer_bypass_forced",
            "1 when new sessions toward the peer go direct by configuration or API",
            peers
                .iter()
                .map(|p| gauge(peer(&p.name), f64::from(u8::from(p.force_bypass)))),
        )?;
        family(
            &mut e,
            "wsx_peer_tunnels",
            "Established tunnels to the peer",
            peers.iter().map(|p| gauge(peer(&p.name), p.tunnels as f64)),
        )?;

        let tunnels: Vec<_> = peers
            .iter()
            .filter_map(|p| p.tunnel.as_ref().map(|t| (p.name.as_str(), t.stats)))
            .collect();
        let congestion = |f: fn(&wsx_tunnel::ControllerState) -> u64| {
            tunnels
                .iter()
                .filter_map(move |(name, s)| s.congestion.map(|c| gauge(peer(name), f(&c) as f64)))
        };
        family(
            &mut e,
            "wsx_tunnel_rtt_seconds",
            "Smoothed round-trip time of the tunnel in use",
            tunnels
                .iter()
                .map(|(name, s)| gauge(peer(name), s.smoothed_rtt.as_secs_f64())),
        )?;
        family(
            &mut e,
            "wsx_fec_decoder_bytes",
            "Bytes held for rebuilding the peer's losses from its parity",
            tunnels
                .iter()
                .map(|(name, s)| gauge(peer(name), s.fec.decoder_bytes as f64)),
        )?;
        family(
            &mut e,
            "wsx_tunnel_datagram_bytes",
            "UDP payload size the tunnel's packets are built to (path MTU discovery)",
            tunnels
                .iter()
                .map(|(name, s)| gauge(peer(name), f64::from(s.datagram_size))),
        )?;
        family(
            &mut e,
            "wsx_tunnel_min_rtt_seconds",
            "Minimum round-trip time of the tunnel in use",
            tunnels
                .iter()
                .map(|(name, s)| gauge(peer(name), s.min_rtt.as_secs_f64())),
        )?;
        family(
            &mut e,
            "wsx_tunnel_pacing_rate_bytes_per_second",
            "The rate the tunnel paces at",
            congestion(|c| c.pacing_rate),
        )?;
        family(
            &mut e,
            "wsx_tunnel_bottleneck_rate_bytes_per_second",
            "The tunnel's estimate of the path's bottleneck rate",
            congestion(|c| c.bottleneck_rate),
        )?;
        let tunnel_counters: [(&str, &str, Read); 14] = [
            ("wsx_tunnel_packets_sent", "Packets sent", |s| {
                s.packets_sent
            }),
            (
                "wsx_tunnel_packets_tracked",
                "Packets sent with data or only ACKs: the ones tracked for loss",
                |s| s.packets_tracked(),
            ),
            ("wsx_tunnel_packets_received", "Packets received", |s| {
                s.packets_received
            }),
            (
                "wsx_tunnel_packets_lost",
                "Tracked packets declared lost, their data sent again (those the peer rebuilt from parity are in wsx_fec_recovered_by_peer; the path's loss is both over wsx_tunnel_packets_tracked)",
                |s| s.packets_lost,
            ),
            ("wsx_tunnel_bytes_sent", "UDP payload bytes sent", |s| {
                s.bytes_sent
            }),
            (
                "wsx_tunnel_bytes_received",
                "UDP payload bytes received",
                |s| s.bytes_received,
            ),
            (
                "wsx_tunnel_auth_failures",
                "Datagrams dropped because they failed authentication",
                |s| s.auth_failures,
            ),
            ("wsx_tunnel_replays", "Datagrams dropped as replays", |s| {
                s.replays
            }),
            (
                "wsx_fec_packets_protected",
                "Data packets sent in FEC blocks",
                |s| s.fec.packets_protected,
            ),
            ("wsx_fec_parity_sent", "Parity packets sent", |s| {
                s.fec.parity_sent
            }),
            ("wsx_fec_parity_bytes_sent", "Parity bytes sent", |s| {
                s.fec.parity_bytes_sent
            }),
            (
                "wsx_fec_recovered_by_peer",
                "Losses the peer rebuilt from our parity (retransmissions avoided)",
                |s| s.fec.recovered_by_peer,
            ),
            (
                "wsx_fec_recovered",
                "The peer's losses rebuilt here from its parity",
                |s| s.fec.recovered,
            ),
            (
                "wsx_fec_unrecoverable_groups",
                "FEC groups of the peer's packets, received here, that lost more than their parity could rebuild",
                |s| s.fec.unrecoverable_groups,
            ),
        ];
        for (name, help, read) in tunnel_counters {
            family(
                &mut e,
                name,
                help,
                tunnels.iter().map(|(p, s)| counter(peer(p), read(s))),
            )?;
        }

        family(
            &mut e,
            "wsx_compression_plain_bytes",
            "Session bytes sent to and received from the peer's streams",
            peers.iter().flat_map(|p| {
                let c = &p.compression;
                [
                    counter(with(peer(&p.name), "direction", "sent"), c.plain_sent),
                    counter(
                        with(peer(&p.name), "direction", "received"),
                        c.plain_received,
                    ),
                ]
            }),
        )?;
        family(
            &mut e,
            "wsx_compression_wire_bytes",
            "Stream bytes those session bytes took (chunk headers included)",
            peers.iter().flat_map(|p| {
                let c = &p.compression;
                [
                    counter(with(peer(&p.name), "direction", "sent"), c.wire_sent),
                    counter(
                        with(peer(&p.name), "direction", "received"),
                        c.wire_received,
                    ),
                ]
            }),
        )?;
        family(
            &mut e,
            "wsx_compression_chunks",
            "Chunks sent: deflated, stored after deflate did not pay, stored without trying",
            peers.iter().flat_map(|p| {
                let c = &p.compression;
                [
                    ("deflated", c.chunks_deflated),
                    ("incompressible", c.chunks_incompressible),
                    ("stored", c.chunks_stored),
                ]
                .map(|(kind, n)| counter(with(peer(&p.name), "kind", kind), n))
            }),
        )?;
        family(
            &mut e,
            "wsx_compression_cpu_seconds",
            "CPU time spent compressing and decoding",
            peers.iter().flat_map(|p| {
                let c = &p.compression;
                [
                    (
                        with(peer(&p.name), "operation", "compress"),
                        ConstCounter::new(c.compress_time.as_secs_f64()),
                    ),
                    (
                        with(peer(&p.name), "operation", "inflate"),
                        ConstCounter::new(c.inflate_time.as_secs_f64()),
                    ),
                ]
            }),
        )?;
        if let Some(shaper) = gateway.shaper() {
            shaper_families(&mut e, &shaper)?;
        }
        Ok(())
    }
}

/// The bandwidth controller, per scenario (label `scenario`) and per filter (label `filter`,
/// its position in the configuration).
fn shaper_families(
    e: &mut DescriptorEncoder<'_>,
    shaper: &wsx_proxy::ShaperStatus,
) -> Result<(), std::fmt::Error> {
    let scenario = |s: &wsx_proxy::ScenarioStatus| vec![("scenario", s.spec.name.clone())];
    let all = &shaper.scenarios;
    family(
        e,
        "wsx_shaper_wan_rate_bps",
        "The WAN rate the scenarios divide, bits per second",
        [gauge(vec![], shaper.wan_rate.bits_per_second() as f64)],
    )?;
    family(
        e,
        "wsx_scenario_bytes",
        "Bytes a scenario's flows sent (an interior scenario: its subtree's)",
        all.iter().map(|s| counter(scenario(s), s.bytes)),
    )?;
    family(
        e,
        "wsx_scenario_rate_bps",
        "A scenario's rate since the previous reading at least a second old, bits per second",
        all.iter().map(|s| gauge(scenario(s), s.rate)),
    )?;
    family(
        e,
        "wsx_scenario_flows",
        "Flows in a scenario, and those with something to send",
        all.iter().flat_map(|s| {
            [
                gauge(with(scenario(s), "state", "open"), s.flows as f64),
                gauge(
                    with(scenario(s), "state", "backlogged"),
                    s.backlogged as f64,
                ),
            ]
        }),
    )?;
    family(
        e,
        "wsx_scenario_held_at_max_seconds",
        "Seconds a scenario's maximum held it back",
        all.iter()
            .filter(|s| s.spec.max_rate.is_some())
            .map(|s| (scenario(s), ConstCounter::new(s.held_at_max.as_secs_f64()))),
    )?;
    family(
        e,
        "wsx_scenario_min_met",
        "1 if a busy scenario with a minimum gets it (within 1 %), 0 if not",
        all.iter()
            .filter_map(|s| Some(gauge(scenario(s), f64::from(u8::from(s.min_met?))))),
    )?;
    family(
        e,
        "wsx_scenario_discarded",
        "Sessions a discard scenario refused",
        all.iter()
            .filter(|s| s.spec.mode == wsx_proxy::wsx_shaper::Mode::Discard)
            .map(|s| counter(scenario(s), s.discarded)),
    )?;
    family(
        e,
        "wsx_filter_matches",
        "Sessions each filter matched (label: its position), and those none matched",
        shaper
            .filters
            .iter()
            .enumerate()
            .map(|(i, f)| counter(vec![("filter", i.to_string())], f.sessions))
            .chain([counter(
                vec![("filter", "none".to_owned())],
                shaper.unmatched,
            )]),
    )
}
