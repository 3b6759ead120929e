//! Peer gateways: which one serves a destination, and whether its tunnel is healthy.
//!
//! Each peer lists the remote prefixes behind it; a destination goes to the peer with the
//! longest matching prefix. A peer is healthy while it has an established tunnel from which
//! something authenticated arrived within the health timeout (both ends send a PING after a
//! quarter of it without traffic, so a silent tunnel means a dead peer or path).
//!
//! Two gateways share one tunnel, whichever of them started it: the tunnel endpoint keeps one
//! connection per peer (a newer handshake replaces an older connection, and when both start
//! at once the larger key's attempt wins), and a gateway only connects while it has no
//! tunnel to the peer, neither in service nor being accepted from it. So one congestion
//! controller sees all the traffic between the two.

use crate::chunked::{Codec, CompressionStats, Counters};
use ipnet::IpNet;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use wsx_tunnel::driver::Tunnel;
use wsx_tunnel::{ConnectionStats, FecMode, PublicKey, TransportConfig};

/// What to do with new connections for a peer that is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Connect directly to the destination, unaccelerated (fail open).
    #[default]
    Bypass,
    /// Refuse the connection (the client sees a reset).
    Reject,
}

/// One peer gateway.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PeerConfig {
    /// A name for logs, the API and `secondary` references.
    pub name: String,
    pub public_key: PublicKey,
    /// Where to connect; `None` waits for the peer to connect (a peer behind NAT).
    pub endpoint: Option<SocketAddr>,
    /// Destinations behind the peer.
    pub prefixes: Vec<IpNet>,
    /// A peer that takes this one's destinations while this one is down.
    pub secondary: Option<String>,
    pub on_failure: FailurePolicy,
    /// Never use the tunnel: every new connection bypasses.
    pub force_bypass: bool,
    /// The deflate level (1 fastest to 9 smallest) of the session data this gateway sends
    /// to the peer; `None` sends it uncompressed. Incompressible data is sent as it is
    /// either way. The peer decodes whatever it receives.
    pub compression: Option<u32>,
    /// Forward error correction of what this gateway sends to the peer, and its overhead
    /// cap (parity packets per data packet).
    pub fec: FecMode,
    pub fec_max_overhead: f64,
    /// SMB on the sessions to TCP port 445 through this peer's tunnel: each is judged
    /// (unsigned, or passed through and why) and counted, and when the peer runs the
    /// read-ahead engine too, both gateways run it on them: the unsigned sessions are read
    /// ahead; the others cross unchanged.
    pub smb: bool,
    /// How far ahead of a client reading a file this gateway reads for sessions the peer's
    /// clients opened, per session (bytes; 0: none).
    pub smb_read_ahead: u64,
    /// How long the peer's gateway may hold what this one read ahead from a file other
    /// clients may write, ms; 0: such files are not read ahead
    /// ([`wsx_smb::engine::Far::set_validity`]).
    pub smb_validity_ms: u32,
}

/// The default deflate level: level 2 compresses text to a third at about 200 MiB/s a
/// core, where level 1 (a fixed Huffman table in zlib-rs) leaves it at 44 % and level 6
/// gains 4 % more at half the speed (BENCHMARKS.md).
pub const DEFAULT_COMPRESSION_LEVEL: u32 = 2;

impl PeerConfig {
    pub fn new(name: impl Into<String>, public_key: PublicKey) -> Self {
        Self {
            name: name.into(),
            public_key,
            endpoint: None,
            prefixes: Vec::new(),
            secondary: None,
            on_failure: FailurePolicy::default(),
            force_bypass: false,
            compression: Some(DEFAULT_COMPRESSION_LEVEL),
            fec: FecMode::default(),
            fec_max_overhead: TransportConfig::default().fec_max_overhead,
            smb: true,
            smb_read_ahead: crate::smb::DEFAULT_READ_AHEAD,
            smb_validity_ms: crate::smb::DEFAULT_VALIDITY_MS,
        }
    }
}

/// A peer and its tunnels.
#[derive(Debug)]
pub(crate) struct Peer {
    state: Mutex<PeerState>,
    /// Compression counters of the sessions with this peer, kept across reloads.
    compression: Arc<Counters>,
}

#[derive(Debug)]
struct PeerState {
    config: PeerConfig,
    tunnels: Vec<Tunnel>,
    /// Tunnels the peer opened that wait for their handshake to be confirmed.
    accepting: usize,
}

/// A tunnel the peer opened, accepted and not yet in service or given up, counted while it
/// lives: meanwhile this gateway does not connect to the peer itself, since the peer would
/// take a second connection for a restart of ours and drop its own for it.
#[derive(Debug)]
pub(crate) struct Accepting(Arc<Peer>);

impl Drop for Accepting {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.accepting = state.accepting.saturating_sub(1);
    }
}

impl Peer {
    pub(crate) fn new(config: PeerConfig) -> Self {
        Self {
            state: Mutex::new(PeerState {
                config,
                tunnels: Vec::new(),
                accepting: 0,
            }),
            compression: Arc::default(),
        }
    }

    pub(crate) fn config(&self) -> PeerConfig {
        self.lock().config.clone()
    }

    /// A changed configuration; tunnels in service take the new FEC setting.
    pub(crate) fn set_config(&self, config: PeerConfig) {
        let mut state = self.lock();
        for tunnel in &state.tunnels {
            tunnel.set_fec(config.fec, config.fec_max_overhead);
        }
        state.config = config;
    }

    /// Takes a tunnel into service, with the peer's FEC setting.
    pub(crate) fn add_tunnel(&self, tunnel: Tunnel) {
        let mut state = self.lock();
        tunnel.set_fec(state.config.fec, state.config.fec_max_overhead);
        state.tunnels.push(tunnel);
    }

    pub(crate) fn compression(&self) -> CompressionStats {
        self.compression.snapshot()
    }

    /// How this gateway codes the session data it sends to the peer.
    pub(crate) fn codec(&self) -> Codec {
        Codec {
            level: self.lock().config.compression.unwrap_or(0),
            counters: self.compression.clone(),
        }
    }

    pub(crate) fn remove_tunnel(&self, tunnel: &Tunnel) {
        self.lock().tunnels.retain(|t| t != tunnel);
    }

    pub(crate) fn tunnels(&self) -> Vec<Tunnel> {
        self.lock().tunnels.clone()
    }

    /// Counts a tunnel the peer opened until the guard is dropped.
    pub(crate) fn accepting(self: &Arc<Self>) -> Accepting {
        self.lock().accepting += 1;
        Accepting(self.clone())
    }

    /// Whether a tunnel the peer opened is on its way into service.
    pub(crate) fn is_accepting(&self) -> bool {
        self.lock().accepting > 0
    }

    /// The tunnel for new streams, if the peer is healthy: the newest established one that
    /// is not silent. (An older one is on its way out, replaced by the newer handshake.)
    pub(crate) fn usable_tunnel(&self, health_timeout: Duration) -> Option<Tunnel> {
        self.tunnels()
            .into_iter()
            .rev()
            .find(|t| t.is_established() && t.silent_for() < health_timeout)
    }

    fn lock(&self) -> MutexGuard<'_, PeerState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A peer's state, for the API and logs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PeerStatus {
    pub name: String,
    pub endpoint: Option<SocketAddr>,
    pub prefixes: Vec<IpNet>,
    /// A tunnel is established and the peer was heard from within the health timeout.
    pub healthy: bool,
    pub force_bypass: bool,
    /// Established tunnels (one per side that connects).
    pub tunnels: usize,
    /// The tunnel in use, if the peer is healthy.
    pub tunnel: Option<TunnelStatus>,
    /// Compression counters of all sessions with the peer since the gateway started.
    pub compression: CompressionStats,
}

/// The tunnel a peer's new sessions use.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TunnelStatus {
    /// The peer's UDP address.
    pub remote: SocketAddr,
    /// The tunnel's counters (they start over with each tunnel), RTT, congestion state and
    /// FEC.
    pub stats: ConnectionStats,
}

pub(crate) fn status(peer: &Peer, health_timeout: Duration) -> PeerStatus {
    let config = peer.config();
    let tunnel = peer.usable_tunnel(health_timeout);
    PeerStatus {
        name: config.name,
        endpoint: config.endpoint,
        prefixes: config.prefixes,
        healthy: tunnel.is_some(),
        force_bypass: config.force_bypass,
        tunnels: peer.tunnels().iter().filter(|t| t.is_established()).count(),
        tunnel: tunnel.as_ref().map(|t| TunnelStatus {
            remote: t.remote_address(),
            stats: t.stats(),
        }),
        compression: peer.compression(),
    }
}

/// Destination prefixes to peers, longest prefix first.
#[derive(Debug, Default)]
pub(crate) struct PrefixTable {
    entries: Vec<(IpNet, Arc<Peer>)>,
}

impl PrefixTable {
    pub(crate) fn new(peers: &[Arc<Peer>]) -> Self {
        let mut entries: Vec<(IpNet, Arc<Peer>)> = peers
            .iter()
            .flat_map(|p| {
                p.config()
                    .prefixes
                    .into_iter()
                    .map(|n| (n.trunc(), p.clone()))
            })
            .collect();
        entries.sort_by_key(|(net, _)| std::cmp::Reverse(net.prefix_len()));
        Self { entries }
    }

    pub(crate) fn lookup(&self, ip: IpAddr) -> Option<&Arc<Peer>> {
        self.entries
            .iter()
            .find(|(net, _)| net.contains(&ip))
            .map(|(_, p)| p)
    }

    /// Every prefix, for the interception rules.
    pub(crate) fn prefixes(&self) -> Vec<IpNet> {
        let mut all: Vec<IpNet> = self.entries.iter().map(|(n, _)| *n).collect();
        all.sort();
        all.dedup();
        IpNet::aggregate(&all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wsx_tunnel::SecretKey;

    fn peer(name: &str, prefixes: &[&str]) -> Arc<Peer> {
        let mut config = PeerConfig::new(name, SecretKey::generate().public_key());
        config.prefixes = prefixes.iter().map(|p| p.parse().unwrap()).collect();
        Arc::new(Peer::new(config))
    }

    #[test]
    fn the_longest_prefix_wins_for_either_family() {
        let wide = peer("wide", &["10.0.0.0/8", "fd00::/8"]);
        let narrow = peer("narrow", &["10.1.2.0/24"]);
        let table = PrefixTable::new(&[wide, narrow]);
        let name = |ip: &str| table.lookup(ip.parse().unwrap()).map(|p| p.config().name);
        assert_eq!(name("10.1.2.3").as_deref(), Some("narrow"));
        assert_eq!(name("10.1.3.3").as_deref(), Some("wide"));
        assert_eq!(name("fd00::1").as_deref(), Some("wide"));
        assert_eq!(name("192.0.2.1"), None);
    }

    #[test]
    fn prefixes_for_the_rules_are_merged() {
        let a = peer("a", &["10.1.0.0/24", "10.1.1.0/24"]);
        let b = peer("b", &["10.1.1.0/24", "fd00::/64"]);
        let table = PrefixTable::new(&[a, b]);
        let list: Vec<String> = table.prefixes().iter().map(|p| p.to_string()).collect();
        assert_eq!(list, ["10.1.0.0/23", "fd00::/64"]);
    }

    #[test]
    fn a_peer_without_tunnels_is_unhealthy() {
        let p = peer("a", &["10.0.0.0/8"]);
        assert!(p.usable_tunnel(Duration::from_secs(2)).is_none());
        assert!(!status(&p, Duration::from_secs(2)).healthy);
    }
}
