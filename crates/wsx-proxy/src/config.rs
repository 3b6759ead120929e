//! The gateway's configuration: what it listens on, its peers, its entry points and the
//! limits of its sessions; and the one check of how peers and listeners refer to each
//! other ([`GatewayConfig::validate_peers`]), which the daemon's configuration file reports
//! against its fields.

use crate::peers::{PeerConfig, PrefixTable};
use crate::rules::{RulesConfig, RulesError};
use crate::shaping::{ShapingConfig, ShapingError};
use crate::socks::SocksUser;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use wsx_tunnel::{SecretKey, Target, TransportConfig};

/// Everything the gateway needs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GatewayConfig {
    pub secret: SecretKey,
    /// The tunnel's UDP address.
    pub tunnel_listen: SocketAddr,
    pub transport: TransportConfig,
    /// Transparent interception; `None` intercepts nothing (the far side of a tunnel only, or
    /// entry points added later). With `transparent_origin` the rule for the servers'
    /// replies is installed all the same.
    pub intercept: Option<InterceptConfig>,
    /// Re-originate inbound sessions from the client's own address, so the server sees the
    /// real client (needs the server's replies to route through this gateway, and a rule to
    /// bring them to its sockets). Off in [`GatewayConfig::new`]; the daemon turns it on by
    /// default where it intercepts.
    pub transparent_origin: bool,
    pub peers: Vec<PeerConfig>,
    /// Explicit entry points: plain listeners whose connections go to a fixed destination
    /// through a named peer. They need no privileges (unprivileged ports) and no rules.
    pub forwards: Vec<ForwardConfig>,
    /// SOCKS5 listeners: like forwarding listeners, but each client names its destination.
    pub socks: Vec<SocksConfig>,
    pub sessions: SessionConfig,
    /// The bandwidth controller; `None` shapes nothing (streams share the tunnel equally).
    pub shaping: Option<ShapingConfig>,
}

/// A SOCKS5 listener (CONNECT; RFC 1929 authentication when `users` is not empty). Every
/// session goes through `peer`, whose gateway connects to the destination the client asked
/// for, resolving names there.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SocksConfig {
    pub name: String,
    pub listen: SocketAddr,
    pub peer: String,
    pub users: Vec<SocksUser>,
}

impl SocksConfig {
    pub fn new(name: impl Into<String>, listen: SocketAddr, peer: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            listen,
            peer: peer.into(),
            users: Vec::new(),
        }
    }
}

/// A forwarding listener: connections to `listen` are carried through `peer`'s tunnel,
/// and the far gateway connects to `to` (resolving a name there).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForwardConfig {
    /// Names the listener in sessions, logs and the API.
    pub name: String,
    pub listen: SocketAddr,
    pub to: Target,
    /// The peer whose tunnel carries it; its health, secondary and `on_failure` apply (a
    /// bypass connects to `to` from this gateway).
    pub peer: String,
}

impl ForwardConfig {
    pub fn new(
        name: impl Into<String>,
        listen: SocketAddr,
        to: Target,
        peer: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            listen,
            to,
            peer: peer.into(),
        }
    }
}

impl GatewayConfig {
    pub fn new(secret: SecretKey, tunnel_listen: SocketAddr) -> Self {
        Self {
            secret,
            tunnel_listen,
            transport: TransportConfig::default(),
            intercept: None,
            transparent_origin: false,
            peers: Vec::new(),
            forwards: Vec::new(),
            socks: Vec::new(),
            sessions: SessionConfig::default(),
            shaping: None,
        }
    }

    /// Checks the peers and the listeners' references to them: every peer has a name, no
    /// two share a name or a public key, none has the gateway's own key, a secondary is
    /// another configured peer, and every listener names a configured peer. The first
    /// mistake, in that order, peer by peer, is returned.
    pub fn validate_peers(&self) -> Result<(), PeerConfigError> {
        let peers = &self.peers;
        let own_key = self.secret.public_key();
        let configured = |name: &str| peers.iter().any(|p| p.name == name);
        for (index, p) in peers.iter().enumerate() {
            let name = p.name.clone();
            if name.is_empty() {
                return Err(PeerConfigError::EmptyName { index });
            }
            let earlier = &peers[..index];
            if earlier.iter().any(|o| o.name == p.name) {
                return Err(PeerConfigError::SharedName { index, name });
            }
            if let Some(other) = earlier.iter().find(|o| o.public_key == p.public_key) {
                let other = other.name.clone();
                return Err(PeerConfigError::SharedKey { index, name, other });
            }
            if p.public_key == own_key {
                return Err(PeerConfigError::OwnKey { index, name });
            }
            if let Some(secondary) = &p.secondary {
                if *secondary == p.name || !configured(secondary) {
                    let secondary = secondary.clone();
                    return Err(PeerConfigError::Secondary {
                        index,
                        name,
                        secondary,
                    });
                }
            }
        }
        let listeners = (self.forwards.iter().enumerate())
            .map(|(i, f)| (ListenerKind::Forward, i, &f.name, &f.peer))
            .chain(
                (self.socks.iter().enumerate())
                    .map(|(i, s)| (ListenerKind::Socks, i, &s.name, &s.peer)),
            );
        for (kind, index, name, peer) in listeners {
            if !configured(peer) {
                return Err(PeerConfigError::UnknownPeer {
                    kind,
                    index,
                    name: name.clone(),
                    peer: peer.clone(),
                });
            }
        }
        Ok(())
    }

    /// What of `new` differs from this running configuration in a way only a restart can
    /// apply: the key, the tunnel address, the transport settings the tunnel's endpoint took
    /// at start (`max_datagram`, `max_rate`, `aes_gcm`), the listeners, and interception on/off.
    pub(crate) fn needs_restart(&self, new: &GatewayConfig) -> Option<&'static str> {
        if new.secret.public_key() != self.secret.public_key() {
            return Some("the private key");
        }
        if new.tunnel_listen != self.tunnel_listen {
            return Some("the tunnel address");
        }
        if new.transport.max_datagram != self.transport.max_datagram
            || new.transport.max_rate != self.transport.max_rate
            || new.transport.aes_gcm != self.transport.aes_gcm
        {
            return Some("the tunnel's max_datagram, max_rate_mbit or cipher");
        }
        if new.sessions.memory_budget != self.sessions.memory_budget {
            return Some("memory_budget");
        }
        if new.forwards != self.forwards || new.socks != self.socks {
            return Some("the forwarding and SOCKS listeners");
        }
        let none = PrefixTable::default();
        if new.intercept.as_ref().map(|i| i.port) != self.intercept.as_ref().map(|i| i.port)
            || new.rules(&none).is_some() != self.rules(&none).is_some()
        {
            return Some(
                "interception on/off, its port, or transparent origin without interception",
            );
        }
        None
    }

    /// The rules this configuration needs: interception, and the rule that brings the
    /// servers' replies to our transparent sockets. Re-originating from clients' addresses
    /// needs the latter even without interception (then with the default mark and table,
    /// and empty prefix sets).
    pub(crate) fn rules(&self, table: &PrefixTable) -> Option<RulesConfig> {
        let (intercept, prefixes) = match &self.intercept {
            Some(i) => (i.clone(), table.prefixes()),
            None if self.transparent_origin => (InterceptConfig::default(), Vec::new()),
            None => return None,
        };
        Some(RulesConfig {
            port: intercept.port,
            mark: intercept.mark,
            route_table: intercept.route_table,
            rule_priority: intercept.rule_priority,
            interfaces: intercept.interfaces,
            prefixes,
        })
    }
}

/// Transparent interception settings; see [`crate::rules`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InterceptConfig {
    pub port: u16,
    pub mark: u32,
    pub route_table: u32,
    pub rule_priority: u32,
    pub interfaces: Vec<String>,
}

impl Default for InterceptConfig {
    fn default() -> Self {
        Self {
            port: 4501,
            // "ws" in ASCII: easy to recognise in `ip rule` output.
            mark: 0x7773,
            route_table: 119,
            rule_priority: 10119,
            interfaces: Vec::new(),
        }
    }
}

/// Limits and timers of sessions. All of them can change on reload.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionConfig {
    /// Sessions at once (both directions); beyond it new intercepted connections bypass and
    /// inbound streams are refused.
    pub max_sessions: usize,
    /// The relay's large buffer per direction, borrowed while data flows
    /// ([`SessionConfig::memory_budget`] bounds how many are out at once).
    pub relay_buffer: usize,
    /// The memory the gateway's buffers may take (see [`MemoryBudget`]): the tunnels' send
    /// and receive windows, relay buffers, and the sessions themselves. Taken at start.
    pub memory_budget: u64,
    pub connect_timeout: Duration,
    /// A session with no traffic either way for this long is reset.
    pub idle_timeout: Duration,
    /// TCP keepalive on LAN sockets.
    pub tcp_keepalive: Option<Duration>,
    /// A peer not heard from for this long is down.
    pub health_timeout: Duration,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            max_sessions: 100_000,
            relay_buffer: 64 * 1024,
            memory_budget: crate::sys::default_memory_budget(),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(2 * 3600),
            tcp_keepalive: Some(Duration::from_secs(60)),
            health_timeout: Duration::from_secs(2),
        }
    }
}

/// How a gateway divides its [`SessionConfig::memory_budget`]; every part is a bound that
/// holds whatever the traffic does.
///
/// - **Tunnels**, half: each peer's tunnel may hold a quarter of the budget divided by the
///   number of peers for sending, and as much for receiving (its connection window), at
///   most the transport's own settings (64 MiB each by default). What a tunnel holds for
///   sending is also held to its congestion window (the path's pace), so it is usually far
///   below the bound.
/// - **Relay buffers**, a quarter: large buffers lent to sessions while data flows, and the
///   bytes the SMB engine reads ahead for them (leased while near holds them; at most half
///   of the quarter).
/// - **Sessions**, a quarter: [`MemoryBudget::PER_SESSION`] each, from accept to end (the
///   task, its small buffers, the tunnel stream's state, the socket's bookkeeping). This is
///   what limits how many sessions the budget carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBudget {
    pub total: u64,
}

impl MemoryBudget {
    /// What one session costs at most outside the shared parts (measured idle: see
    /// BENCHMARKS.md), rounded up.
    pub const PER_SESSION: u64 = 32 * 1024;

    /// The bound on each tunnel's send buffer and on its connection window, with `peers`
    /// peers.
    pub fn per_tunnel(&self, peers: usize) -> u64 {
        self.total / 4 / peers.max(1) as u64
    }

    /// The bytes of large relay buffers lent at once.
    pub fn relay_buffers(&self) -> u64 {
        self.total / 4
    }

    /// Sessions the budget carries.
    pub fn sessions(&self) -> usize {
        usize::try_from(self.total / 4 / Self::PER_SESSION)
            .unwrap_or(usize::MAX)
            .max(1)
    }
}

/// Errors from starting or reconfiguring the gateway.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// The tunnel's UDP socket could not be bound.
    #[error("binding the tunnel socket {addr}: {source}")]
    TunnelSocket { addr: SocketAddr, source: io::Error },
    /// A transparent listener could not be bound.
    #[error("binding the transparent listener {addr}: {source}")]
    Listener { addr: SocketAddr, source: io::Error },
    /// The interception rules could not be installed or changed.
    #[error("interception rules: {0}")]
    Rules(#[from] RulesError),
    /// The new configuration changes something only a restart can.
    #[error("{0} cannot change without a restart")]
    NeedsRestart(&'static str),
    /// The peers, or the listeners' references to them, do not hold together.
    #[error("peer configuration: {0}")]
    Peers(#[from] PeerConfigError),
    /// The scenarios or filters cannot be used.
    #[error("shaper configuration: {0}")]
    Shaping(#[from] ShapingError),
}

/// A mistake in the peers or in how the listeners refer to them. Each variant carries the
/// position of the offending entry in [`GatewayConfig::peers`] (or in `forwards` or
/// `socks`), so that a configuration file can point at the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerConfigError {
    /// A peer has an empty name.
    #[error("peer {index} has an empty name")]
    EmptyName { index: usize },
    /// A peer has the name of an earlier one.
    #[error("two peers are named \"{name}\"")]
    SharedName { index: usize, name: String },
    /// A peer has the public key of an earlier one, `other`.
    #[error("peers \"{other}\" and \"{name}\" share a public key")]
    SharedKey {
        index: usize,
        name: String,
        other: String,
    },
    /// A peer has the gateway's own public key.
    #[error("peer \"{name}\" has the gateway's own public key")]
    OwnKey { index: usize, name: String },
    /// A peer's secondary is the peer itself or no configured peer.
    #[error("peer \"{name}\": secondary \"{secondary}\" is not another configured peer")]
    Secondary {
        index: usize,
        name: String,
        secondary: String,
    },
    /// A forwarding or SOCKS listener names a peer that is not configured.
    #[error("{kind} listener \"{name}\": \"{peer}\" is not a configured peer")]
    UnknownPeer {
        kind: ListenerKind,
        index: usize,
        name: String,
        peer: String,
    },
}

/// The explicit entry points that name a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListenerKind {
    /// A forwarding listener, in [`GatewayConfig::forwards`].
    Forward,
    /// A SOCKS5 listener, in [`GatewayConfig::socks`].
    Socks,
}

impl std::fmt::Display for ListenerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ListenerKind::Forward => "forwarding",
            ListenerKind::Socks => "SOCKS",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gateway(peers: &[(&str, &SecretKey)]) -> GatewayConfig {
        let addr = SocketAddr::from(([127, 0, 0, 1], 4500));
        let mut config = GatewayConfig::new(SecretKey::generate(), addr);
        for (name, key) in peers {
            config.peers.push(PeerConfig::new(*name, key.public_key()));
        }
        config
    }

    #[test]
    fn distinct_peers_and_listeners_naming_them_are_valid() {
        let (a, b) = (SecretKey::generate(), SecretKey::generate());
        let mut config = gateway(&[("hq", &a), ("dr", &b)]);
        config.peers[0].secondary = Some("dr".into());
        let listen = SocketAddr::from(([127, 0, 0, 1], 1080));
        let to = Target::Addr(listen);
        config
            .forwards
            .push(ForwardConfig::new("files", listen, to, "hq"));
        config.socks.push(SocksConfig::new("apps", listen, "dr"));
        assert_eq!(config.validate_peers(), Ok(()));
    }

    #[test]
    fn each_mistake_names_the_entry() {
        let (a, b) = (SecretKey::generate(), SecretKey::generate());
        let mut config = gateway(&[("hq", &a), ("", &b)]);
        assert_eq!(
            config.validate_peers(),
            Err(PeerConfigError::EmptyName { index: 1 })
        );
        config.peers[1].name = "hq".into();
        assert_eq!(
            config.validate_peers(),
            Err(PeerConfigError::SharedName {
                index: 1,
                name: "hq".into()
            })
        );
        config.peers[1].name = "dr".into();
        config.peers[1].public_key = a.public_key();
        assert_eq!(
            config.validate_peers(),
            Err(PeerConfigError::SharedKey {
                index: 1,
                name: "dr".into(),
                other: "hq".into()
            })
        );
        config.peers[1].public_key = config.secret.public_key();
        assert_eq!(
            config.validate_peers(),
            Err(PeerConfigError::OwnKey {
                index: 1,
                name: "dr".into()
            })
        );
    }

    #[test]
    fn a_secondary_must_be_another_configured_peer() {
        let (a, b) = (SecretKey::generate(), SecretKey::generate());
        for secondary in ["hq", "nobody"] {
            let mut config = gateway(&[("hq", &a), ("dr", &b)]);
            config.peers[0].secondary = Some(secondary.into());
            assert_eq!(
                config.validate_peers(),
                Err(PeerConfigError::Secondary {
                    index: 0,
                    name: "hq".into(),
                    secondary: secondary.into()
                })
            );
        }
    }

    #[test]
    fn listeners_must_name_a_configured_peer() {
        let a = SecretKey::generate();
        let listen = SocketAddr::from(([127, 0, 0, 1], 1080));
        let mut config = gateway(&[("hq", &a)]);
        config.socks.push(SocksConfig::new("apps", listen, "hq"));
        config.socks.push(SocksConfig::new("web", listen, "dr"));
        let error = config.validate_peers();
        assert_eq!(
            error,
            Err(PeerConfigError::UnknownPeer {
                kind: ListenerKind::Socks,
                index: 1,
                name: "web".into(),
                peer: "dr".into()
            })
        );
        let message = error.err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(
            message,
            "SOCKS listener \"web\": \"dr\" is not a configured peer"
        );
        let to = Target::Addr(listen);
        config
            .forwards
            .push(ForwardConfig::new("files", listen, to, "nobody"));
        assert!(matches!(
            config.validate_peers(),
            Err(PeerConfigError::UnknownPeer {
                kind: ListenerKind::Forward,
                index: 0,
                ..
            })
        ));
    }

    #[test]
    fn what_only_a_restart_can_change_is_named() {
        let a = SecretKey::generate();
        let old = gateway(&[("hq", &a)]);
        let mut new = old.clone();
        new.peers[0].prefixes = vec!["10.0.0.0/8".parse().unwrap()];
        new.sessions.max_sessions = 10;
        assert_eq!(old.needs_restart(&new), None);
        new.tunnel_listen = SocketAddr::from(([127, 0, 0, 1], 4600));
        assert_eq!(old.needs_restart(&new), Some("the tunnel address"));
        let mut new = old.clone();
        new.secret = SecretKey::generate();
        assert_eq!(old.needs_restart(&new), Some("the private key"));
        let mut new = old.clone();
        new.intercept = Some(InterceptConfig::default());
        assert!(old.needs_restart(&new).is_some());
    }
}
