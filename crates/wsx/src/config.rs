//! The configuration file, `/etc/wsx/wsx.toml`: parsing, validation and conversion to the
//! gateway's settings.
//!
//! Unknown fields are errors, and every error names the file, the line and column, and the
//! field. The private key prints as `<secret>` wherever the configuration is logged or
//! shown.

use anyhow::{Context, Result, bail};
use ipnet::IpNet;
use serde::{Deserialize, Deserializer};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;
use wsx_proxy::{FailurePolicy, GatewayConfig, InterceptConfig, PeerConfig, SessionConfig};
use wsx_tunnel::{FecMode, PublicKey, SecretKey};

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    pub(crate) tunnel: Tunnel,
    /// Transparent interception; leave the table out to run without TPROXY.
    pub(crate) intercept: Option<Intercept>,
    #[serde(default)]
    pub(crate) sessions: Sessions,
    #[serde(default, rename = "peer")]
    pub(crate) peers: Vec<Peer>,
    #[serde(default)]
    pub(crate) log: Log,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Tunnel {
    /// The tunnel's UDP address.
    #[serde(default = "default_listen")]
    pub(crate) listen: SocketAddr,
    /// The gateway's private key (base64), or…
    pub(crate) private_key: Option<Spanned<Secret>>,
    /// …a file holding it.
    pub(crate) private_key_file: Option<PathBuf>,
    /// The contracted WAN rate, Mbit/s: the tunnel never sends faster.
    pub(crate) max_rate_mbit: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Intercept {
    #[serde(default = "default_port")]
    pub(crate) port: u16,
    #[serde(default)]
    pub(crate) interfaces: Vec<String>,
    #[serde(default = "default_mark")]
    pub(crate) mark: u32,
    #[serde(default = "default_route_table")]
    pub(crate) route_table: u32,
    #[serde(default = "default_rule_priority")]
    pub(crate) rule_priority: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Sessions {
    pub(crate) transparent_origin: bool,
    pub(crate) max_sessions: usize,
    pub(crate) relay_buffer_kib: usize,
    #[serde(with = "humantime_serde")]
    pub(crate) connect_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) idle_timeout: Duration,
    /// `"0s"` turns TCP keepalive off.
    #[serde(with = "humantime_serde")]
    pub(crate) tcp_keepalive: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) health_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub(crate) drain_timeout: Duration,
}

impl Default for Sessions {
    fn default() -> Self {
        let d = SessionConfig::default();
        Self {
            transparent_origin: true,
            max_sessions: d.max_sessions,
            relay_buffer_kib: d.relay_buffer / 1024,
            connect_timeout: d.connect_timeout,
            idle_timeout: d.idle_timeout,
            tcp_keepalive: d.tcp_keepalive.unwrap_or_default(),
            health_timeout: d.health_timeout,
            drain_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Peer {
    pub(crate) name: Spanned<String>,
    pub(crate) public_key: Spanned<Key>,
    pub(crate) endpoint: Option<SocketAddr>,
    #[serde(default)]
    pub(crate) prefixes: Vec<IpNet>,
    pub(crate) secondary: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) on_failure: OnFailure,
    #[serde(default)]
    pub(crate) force_bypass: bool,
    /// Deflate the session data sent to this peer where it pays.
    #[serde(default = "yes")]
    pub(crate) compression: bool,
    #[serde(default = "default_compression_level")]
    pub(crate) compression_level: Spanned<u32>,
    /// Forward error correction of what is sent to this peer.
    #[serde(default)]
    pub(crate) fec: Fec,
    #[serde(default = "default_fec_max_overhead")]
    pub(crate) fec_max_overhead: Spanned<f64>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Fec {
    Off,
    On,
    #[default]
    Adaptive,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OnFailure {
    #[default]
    Bypass,
    Reject,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Log {
    /// A tracing filter: `info`, `debug`, `wsx_proxy=debug,info`…
    #[serde(default = "default_level")]
    pub(crate) level: String,
}

impl Default for Log {
    fn default() -> Self {
        Self {
            level: default_level(),
        }
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([0u16; 8], 4500))
}
fn default_port() -> u16 {
    InterceptConfig::default().port
}
fn default_mark() -> u32 {
    InterceptConfig::default().mark
}
fn default_route_table() -> u32 {
    InterceptConfig::default().route_table
}
fn default_rule_priority() -> u32 {
    InterceptConfig::default().rule_priority
}
fn yes() -> bool {
    true
}
fn default_compression_level() -> Spanned<u32> {
    Spanned::new(0..0, wsx_proxy::DEFAULT_COMPRESSION_LEVEL)
}
fn default_fec_max_overhead() -> Spanned<f64> {
    Spanned::new(
        0..0,
        wsx_tunnel::TransportConfig::default().fec_max_overhead,
    )
}
fn default_level() -> String {
    "info".into()
}

/// A private key that never prints.
pub(crate) struct Secret(pub(crate) SecretKey);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<secret>")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        // The key's own error never echoes the input.
        text.parse()
            .map(Secret)
            .map_err(|e| serde::de::Error::custom(format!("not a private key: {e}")))
    }
}

/// A public key.
#[derive(Debug)]
pub(crate) struct Key(pub(crate) PublicKey);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse()
            .map(Key)
            .map_err(|e| serde::de::Error::custom(format!("not a public key: {e}")))
    }
}

/// A configuration read from a file, with what is needed to report errors against it.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub(crate) path: PathBuf,
    pub(crate) text: String,
    pub(crate) config: Config,
}

impl Loaded {
    /// Reads and parses `path`.
    pub(crate) fn read(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(path, text)
    }

    pub(crate) fn parse(path: &Path, text: String) -> Result<Self> {
        let deserializer = toml::Deserializer::new(&text);
        let config: Config = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            // `Spanned` fields show up as an inner segment of their own.
            let field = e
                .path()
                .to_string()
                .replace(".$__serde_spanned_private_value", "");
            let e = e.into_inner();
            let at = e
                .span()
                .map(|s| position(&text, s.start))
                .unwrap_or_default();
            // The root path is ".": the error is about the file as a whole.
            let field = if field == "." {
                String::new()
            } else {
                format!(" {field}:")
            };
            anyhow::anyhow!("{}{at}:{field} {}", path.display(), e.message().trim_end())
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            text,
            config,
        })
    }

    /// `file:line:column` of a byte offset, for errors found after parsing.
    fn at(&self, offset: usize) -> String {
        format!("{}{}", self.path.display(), position(&self.text, offset))
    }

    /// Checks what parsing cannot and builds the gateway's configuration.
    pub(crate) fn gateway(&self) -> Result<GatewayConfig> {
        let c = &self.config;
        let secret = match (&c.tunnel.private_key, &c.tunnel.private_key_file) {
            (Some(key), None) => key.get_ref().0.clone(),
            (None, Some(file)) => {
                let text = std::fs::read_to_string(file).with_context(|| {
                    format!(
                        "{}: tunnel.private_key_file: reading {}",
                        self.path.display(),
                        file.display()
                    )
                })?;
                text.parse().map_err(|e| {
                    anyhow::anyhow!(
                        "{}: tunnel.private_key_file: {}: not a private key: {e}",
                        self.path.display(),
                        file.display()
                    )
                })?
            }
            (Some(key), Some(_)) => bail!(
                "{}: tunnel: give private_key or private_key_file, not both",
                self.at(key.span().start)
            ),
            (None, None) => bail!(
                "{}: tunnel: private_key or private_key_file is required",
                self.path.display()
            ),
        };
        let mut gateway = GatewayConfig::new(secret, c.tunnel.listen);
        if let Some(mbit) = c.tunnel.max_rate_mbit {
            if !(mbit > 0.0 && mbit.is_finite()) {
                bail!(
                    "{}: tunnel.max_rate_mbit: must be a positive number",
                    self.path.display()
                );
            }
            gateway.transport.max_rate = Some((mbit * 1e6 / 8.0) as u64);
        }
        gateway.intercept = c.intercept.as_ref().map(|i| {
            let mut intercept = InterceptConfig::default();
            intercept.port = i.port;
            intercept.interfaces = i.interfaces.clone();
            intercept.mark = i.mark;
            intercept.route_table = i.route_table;
            intercept.rule_priority = i.rule_priority;
            intercept
        });
        if let Some(i) = &c.intercept {
            if i.port == 0 || i.mark == 0 || i.route_table == 0 {
                bail!(
                    "{}: intercept: port, mark and route_table must be non-zero",
                    self.path.display()
                );
            }
        }
        let s = &c.sessions;
        if s.max_sessions == 0 || s.relay_buffer_kib == 0 {
            bail!(
                "{}: sessions: max_sessions and relay_buffer_kib must be non-zero",
                self.path.display()
            );
        }
        if s.health_timeout < Duration::from_millis(200) {
            bail!(
                "{}: sessions.health_timeout: at least 200ms",
                self.path.display()
            );
        }
        gateway.transparent_origin = s.transparent_origin;
        let mut sessions = SessionConfig::default();
        sessions.max_sessions = s.max_sessions;
        sessions.relay_buffer = s.relay_buffer_kib * 1024;
        sessions.connect_timeout = s.connect_timeout;
        sessions.idle_timeout = s.idle_timeout;
        sessions.tcp_keepalive = (!s.tcp_keepalive.is_zero()).then_some(s.tcp_keepalive);
        sessions.health_timeout = s.health_timeout;
        gateway.sessions = sessions;
        let own_key = gateway.secret.public_key();
        for (i, p) in c.peers.iter().enumerate() {
            let name = p.name.get_ref();
            if name.is_empty() {
                bail!(
                    "{}: peer[{i}].name: must not be empty",
                    self.at(p.name.span().start)
                );
            }
            if let Some(earlier) = c.peers[..i].iter().find(|o| o.name.get_ref() == name) {
                let _ = earlier;
                bail!(
                    "{}: peer[{i}].name: \"{name}\" is used by another peer",
                    self.at(p.name.span().start)
                );
            }
            if c.peers[..i]
                .iter()
                .any(|o| o.public_key.get_ref().0 == p.public_key.get_ref().0)
            {
                bail!(
                    "{}: peer[{i}].public_key: used by another peer",
                    self.at(p.public_key.span().start)
                );
            }
            if p.public_key.get_ref().0 == own_key {
                bail!(
                    "{}: peer[{i}].public_key: this is the gateway's own key",
                    self.at(p.public_key.span().start)
                );
            }
            if let Some(secondary) = &p.secondary {
                let s = secondary.get_ref();
                if s == name || !c.peers.iter().any(|o| o.name.get_ref() == s) {
                    bail!(
                        "{}: peer[{i}].secondary: \"{s}\" is not another peer's name",
                        self.at(secondary.span().start)
                    );
                }
            }
            let mut peer = PeerConfig::new(name.clone(), p.public_key.get_ref().0);
            peer.endpoint = p.endpoint;
            peer.prefixes = p.prefixes.clone();
            peer.secondary = p.secondary.as_ref().map(|s| s.get_ref().clone());
            peer.on_failure = match p.on_failure {
                OnFailure::Bypass => FailurePolicy::Bypass,
                OnFailure::Reject => FailurePolicy::Reject,
            };
            peer.force_bypass = p.force_bypass;
            let level = *p.compression_level.get_ref();
            if !(1..=9).contains(&level) {
                bail!(
                    "{}: peer[{i}].compression_level: 1 (fastest) to 9 (smallest)",
                    self.at(p.compression_level.span().start)
                );
            }
            peer.compression = p.compression.then_some(level);
            peer.fec = match p.fec {
                Fec::Off => FecMode::Off,
                Fec::On => FecMode::On,
                Fec::Adaptive => FecMode::Adaptive,
            };
            let overhead = *p.fec_max_overhead.get_ref();
            if !(overhead > 0.0 && overhead <= 1.0) {
                bail!(
                    "{}: peer[{i}].fec_max_overhead: above 0 and at most 1 (parity packets per data packet)",
                    self.at(p.fec_max_overhead.span().start)
                );
            }
            peer.fec_max_overhead = overhead;
            gateway.peers.push(peer);
        }
        Ok(gateway)
    }
}

/// `:line:column` (1-based) of a byte offset.
fn position(text: &str, offset: usize) -> String {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!(":{line}:{column}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "oAaVR0Ow0ZDXhbgMGTNyDo4ZJo6jC9F0Q7ZzP5yX3WM=";

    fn parse(text: &str) -> Result<GatewayConfig> {
        Loaded::parse(Path::new("wsx.toml"), text.to_string())?.gateway()
    }

    fn peer_key() -> String {
        SecretKey::generate().public_key().to_string()
    }

    #[test]
    fn a_minimal_file_gets_the_defaults() {
        let c = parse(&format!("[tunnel]\nprivate_key = \"{KEY_A}\"\n")).unwrap();
        assert_eq!(c.tunnel_listen, "[::]:4500".parse().unwrap());
        assert!(c.intercept.is_none());
        assert!(c.transparent_origin);
        assert_eq!(c.sessions, SessionConfig::default());
    }

    #[test]
    fn a_full_file_is_read() {
        let (k1, k2) = (peer_key(), peer_key());
        let text = format!(
            r#"
[tunnel]
listen = "0.0.0.0:4600"
private_key = "{KEY_A}"
max_rate_mbit = 100

[intercept]
port = 4601
interfaces = ["lan0"]

[sessions]
transparent_origin = false
health_timeout = "3s"
tcp_keepalive = "0s"

[[peer]]
name = "hq"
public_key = "{k1}"
endpoint = "192.0.2.1:4500"
prefixes = ["10.1.0.0/16", "fd00:1::/48"]
secondary = "dr"

[[peer]]
name = "dr"
public_key = "{k2}"
on_failure = "reject"
compression = false
fec = "off"
"#
        );
        let c = parse(&text).unwrap();
        assert_eq!(c.transport.max_rate, Some(12_500_000));
        let intercept = c.intercept.unwrap();
        assert_eq!(
            (intercept.port, intercept.interfaces.as_slice()),
            (4601, &["lan0".to_string()][..])
        );
        assert!(!c.transparent_origin);
        assert_eq!(c.sessions.tcp_keepalive, None);
        assert_eq!(c.sessions.health_timeout, Duration::from_secs(3));
        assert_eq!(c.peers.len(), 2);
        assert_eq!(c.peers[0].secondary.as_deref(), Some("dr"));
        assert_eq!(c.peers[0].prefixes.len(), 2);
        assert_eq!(c.peers[1].on_failure, FailurePolicy::Reject);
        assert_eq!(
            (c.peers[0].compression, c.peers[0].fec),
            (Some(2), FecMode::Adaptive)
        );
        assert_eq!(
            (c.peers[1].compression, c.peers[1].fec),
            (None, FecMode::Off)
        );
    }

    #[test]
    fn compression_and_fec_settings_are_checked() {
        let peer = |extra: &str| {
            format!(
                "[tunnel]\nprivate_key = \"{KEY_A}\"\n[[peer]]\nname = \"a\"\npublic_key = \"{}\"\n{extra}\n",
                peer_key()
            )
        };
        let c = parse(&peer(
            "compression_level = 9\nfec = \"on\"\nfec_max_overhead = 0.1",
        ))
        .unwrap();
        assert_eq!(
            (
                c.peers[0].compression,
                c.peers[0].fec,
                c.peers[0].fec_max_overhead
            ),
            (Some(9), FecMode::On, 0.1)
        );
        let e = parse(&peer("compression_level = 0"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "wsx.toml:6:21: peer[0].compression_level: 1 (fastest) to 9 (smallest)"
        );
        let e = parse(&peer("fec_max_overhead = 2.0"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("wsx.toml:6:20: peer[0].fec_max_overhead: above 0"),
            "{e}"
        );
        let e = parse(&peer("fec = \"sometimes\"")).unwrap_err().to_string();
        assert!(
            e.starts_with("wsx.toml:6:7: peer[0].fec: unknown variant"),
            "{e}"
        );
    }

    #[test]
    fn unknown_fields_are_named_with_their_line_and_column() {
        let e = parse(&format!(
            "[tunnel]\nprivate_key = \"{KEY_A}\"\nlisten_on = \"x\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("wsx.toml:3:1: tunnel.listen_on: unknown field `listen_on`"),
            "{e}"
        );
    }

    #[test]
    fn bad_values_are_named() {
        let e = parse("[tunnel]\nprivate_key = \"short\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("wsx.toml:2:15: tunnel.private_key: not a private key"),
            "{e}"
        );
        // The secret itself is never echoed.
        assert!(!e.contains("short\""), "{e}");
        let text = format!(
            "[tunnel]\nprivate_key = \"{KEY_A}\"\n[[peer]]\nname = \"a\"\npublic_key = \"{}\"\nprefixes = [\"10.0.0.0/33\"]\n",
            peer_key()
        );
        let e = parse(&text).unwrap_err().to_string();
        assert_eq!(
            e,
            "wsx.toml:6:13: peer[0].prefixes[0]: invalid IP address syntax"
        );
    }

    #[test]
    fn cross_field_mistakes_point_at_the_field() {
        let text = format!(
            "[tunnel]\nprivate_key = \"{KEY_A}\"\n[[peer]]\nname = \"a\"\npublic_key = \"{}\"\nsecondary = \"nobody\"\n",
            peer_key()
        );
        let e = parse(&text).unwrap_err().to_string();
        assert_eq!(
            e,
            "wsx.toml:6:13: peer[0].secondary: \"nobody\" is not another peer's name"
        );
        let k = peer_key();
        let text = format!(
            "[tunnel]\nprivate_key = \"{KEY_A}\"\n[[peer]]\nname = \"a\"\npublic_key = \"{k}\"\n[[peer]]\nname = \"a\"\npublic_key = \"{}\"\n",
            peer_key()
        );
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.starts_with("wsx.toml:7:8: peer[1].name"), "{e}");
        let e = parse("[tunnel]\nlisten = \"[::]:1\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("private_key or private_key_file is required"),
            "{e}"
        );
    }

    #[test]
    fn the_secret_is_masked_in_debug_output() {
        let loaded = Loaded::parse(
            Path::new("wsx.toml"),
            format!("[tunnel]\nprivate_key = \"{KEY_A}\"\n"),
        )
        .unwrap();
        let shown = format!("{:?}", loaded.config);
        assert!(shown.contains("<secret>"));
        assert!(!shown.contains(KEY_A));
    }
}
