//! The configuration file, `/etc/wsx/wsx.toml`: parsing, validation and conversion to the
//! gateway's settings.
//!
//! Unknown fields are errors, and every error ([`ConfigError`]) names the file, the line and
//! column, and the field. The private key and the API tokens print as `<secret>` wherever
//! the configuration is logged or shown (`Debug`, and the JSON the API serves).

pub(crate) mod edit;
mod shaper;

use anyhow::{Context, Result};
use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;
use wsx_api::{ApiConfig, TlsFiles};
use wsx_proxy::{
    FailurePolicy, GatewayConfig, InterceptConfig, ListenerKind, PeerConfig, PeerConfigError,
    SessionConfig,
};
use wsx_tunnel::{FecMode, PublicKey, SecretKey};

/// The whole file.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    pub(crate) tunnel: Tunnel,
    /// Transparent interception; leave the table out to run without TPROXY.
    pub(crate) intercept: Option<Intercept>,
    #[serde(default)]
    pub(crate) sessions: Sessions,
    #[serde(default, rename = "peer")]
    pub(crate) peers: Vec<Peer>,
    /// Forwarding listeners: explicit entry points, no interception needed.
    #[serde(default, rename = "forward")]
    pub(crate) forwards: Vec<Forward>,
    /// SOCKS5 listeners: explicit entry points where the client names the destination.
    #[serde(default)]
    pub(crate) socks: Vec<Socks>,
    #[serde(default)]
    pub(crate) log: Log,
    /// The management API; leave the table out to run without it.
    pub(crate) api: Option<Api>,
    /// The bandwidth controller; leave the table out to shape nothing.
    pub(crate) shaper: Option<shaper::Shaper>,
    #[serde(default, rename = "scenario")]
    pub(crate) scenarios: Vec<shaper::Scenario>,
    #[serde(default, rename = "address_list")]
    pub(crate) address_lists: Vec<shaper::AddressList>,
    #[serde(default, rename = "filter")]
    pub(crate) filters: Vec<shaper::Filter>,
}

#[derive(Debug, Deserialize, Serialize)]
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
    /// The largest UDP payload the tunnel sends or accepts, bytes (1200-9216; default 9000):
    /// a cap on path MTU discovery.
    pub(crate) max_datagram: Option<u16>,
    /// The packet ciphers offered to peers.
    #[serde(default)]
    pub(crate) cipher: CipherChoice,
}

/// `tunnel.cipher`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum CipherChoice {
    /// AES-256-GCM where both gateways have AES instructions, else ChaCha20-Poly1305.
    #[default]
    Auto,
    /// ChaCha20-Poly1305 always.
    Chacha20Poly1305,
}

#[derive(Debug, Deserialize, Serialize)]
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

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Sessions {
    /// Unset: on when this gateway intercepts (`[intercept]`), off otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) transparent_origin: Option<bool>,
    pub(crate) max_sessions: usize,
    pub(crate) relay_buffer_kib: usize,
    /// Unset: a quarter of the host's memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) memory_budget_mib: Option<u64>,
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
            transparent_origin: None,
            max_sessions: d.max_sessions,
            relay_buffer_kib: d.relay_buffer / 1024,
            memory_budget_mib: None,
            connect_timeout: d.connect_timeout,
            idle_timeout: d.idle_timeout,
            tcp_keepalive: d.tcp_keepalive.unwrap_or_default(),
            health_timeout: d.health_timeout,
            drain_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
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
    /// SMB on sessions to TCP 445 through this peer: judged, counted and, when the peer
    /// runs the engine too, read ahead if unsigned.
    #[serde(default = "yes")]
    pub(crate) smb: bool,
    /// How far ahead of a client this gateway reads, per session, for the peer's clients.
    #[serde(default = "default_smb_read_ahead_mib")]
    pub(crate) smb_read_ahead_mib: Spanned<u64>,
    /// How long the peer's gateway may hold what this one read ahead from a file other
    /// clients may write, ms (0: such files are not read ahead).
    #[serde(default = "default_smb_validity_ms")]
    pub(crate) smb_validity_ms: Spanned<u32>,
}

/// `[[forward]]`: connections to `listen` go through `peer`, whose gateway connects to `to`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Forward {
    pub(crate) name: Spanned<String>,
    pub(crate) listen: SocketAddr,
    /// `HOST:PORT` (a name the far gateway resolves, or an address; IPv6 in brackets).
    pub(crate) to: Spanned<String>,
    pub(crate) peer: Spanned<String>,
}

/// `[[socks]]`: a SOCKS5 listener whose sessions go through `peer`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Socks {
    pub(crate) name: Spanned<String>,
    pub(crate) listen: SocketAddr,
    pub(crate) peer: Spanned<String>,
    /// Username/password authentication (RFC 1929) when not empty.
    #[serde(default)]
    pub(crate) users: Vec<SocksUser>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SocksUser {
    pub(crate) name: String,
    #[serde(serialize_with = "mask")]
    pub(crate) password: String,
}

fn mask<S: Serializer>(_: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("<secret>")
}

/// Parses `HOST:PORT`: an address, or a name for the far side to resolve.
fn parse_target(text: &str) -> Result<wsx_tunnel::Target, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(wsx_tunnel::Target::Addr(addr));
    }
    let (host, port) = text
        .rsplit_once(':')
        .ok_or("HOST:PORT, e.g. files.example.net:445 or [fd00::5]:80")?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{port:?} is not a port number"))?;
    let valid = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !valid || port == 0 {
        return Err(format!(
            "{text:?}: not HOST:PORT with a DNS name or an address"
        ));
    }
    Ok(wsx_tunnel::Target::Name {
        host: host.to_owned(),
        port,
    })
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Fec {
    Off,
    On,
    #[default]
    Adaptive,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OnFailure {
    #[default]
    Bypass,
    Reject,
}

#[derive(Debug, Deserialize, Serialize)]
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

/// `[api]`: where the REST API listens and who may use it.
#[derive(Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Api {
    /// Localhost by default: put it elsewhere only with TLS, or behind a firewall.
    #[serde(default = "default_api_listen")]
    pub(crate) listen: SocketAddr,
    /// Bearer tokens, or…
    #[serde(default, serialize_with = "mask_all")]
    pub(crate) tokens: Vec<Spanned<String>>,
    /// …a file of them, one per line (`#` comments).
    pub(crate) token_file: Option<PathBuf>,
    /// Serve HTTPS with this certificate chain and key (PEM files).
    pub(crate) tls_cert: Option<PathBuf>,
    pub(crate) tls_key: Option<PathBuf>,
}

/// The shortest token accepted: 128 bits in the base64 of `wsx gentoken` is 22 characters.
const MIN_TOKEN_LEN: usize = 16;

fn default_api_listen() -> SocketAddr {
    ApiConfig::DEFAULT_LISTEN
}

fn mask_all<S: Serializer>(tokens: &[Spanned<String>], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(tokens.iter().map(|_| "<secret>"))
}

/// Bounds of `tunnel.max_datagram`: a peer refuses a smaller declared size, and the tunnel
/// receives no larger datagram.
const MIN_DATAGRAM: u16 = 1200;
const MAX_DATAGRAM: u16 = wsx_tunnel::MAX_DATAGRAM;

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
/// The most an operator may let far read ahead of one SMB client: four times what a
/// 10 Gbit/s path of 50 ms holds.
const MAX_SMB_READ_AHEAD_MIB: u64 = 256;
/// A validity window is short by design: beyond this, use a share mode or an oplock.
const MAX_SMB_VALIDITY_MS: u32 = 10_000;

fn yes() -> bool {
    true
}
fn default_compression_level() -> Spanned<u32> {
    Spanned::new(0..0, wsx_proxy::DEFAULT_COMPRESSION_LEVEL)
}
fn default_smb_read_ahead_mib() -> Spanned<u64> {
    Spanned::new(0..0, wsx_proxy::DEFAULT_SMB_READ_AHEAD >> 20)
}
fn default_smb_validity_ms() -> Spanned<u32> {
    Spanned::new(0..0, wsx_proxy::DEFAULT_SMB_VALIDITY_MS)
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

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("<secret>")
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

impl Serialize for Key {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse()
            .map(Key)
            .map_err(|e| serde::de::Error::custom(format!("not a public key: {e}")))
    }
}

/// What is wrong with a configuration, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConfigError {
    pub(crate) file: PathBuf,
    /// Line and column (1-based), when the error is about one place in the file.
    pub(crate) position: Option<(usize, usize)>,
    /// The field's path: `peer[1].prefixes[0]`.
    pub(crate) field: Option<String>,
    pub(crate) message: String,
}

impl fmt::Display for ConfigError {
    /// `file:line:column: field: message`, leaving out what is not known.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some((line, column)) = self.position {
            write!(f, ":{line}:{column}")?;
        }
        f.write_str(":")?;
        if let Some(field) = &self.field {
            write!(f, " {field}:")?;
        }
        write!(f, " {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

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
            anyhow::Error::new(ConfigError {
                file: path.to_path_buf(),
                position: e.span().map(|s| position(&text, s.start)),
                // The root path is ".": the error is about the file as a whole.
                field: (field != ".").then_some(field),
                message: e.message().trim_end().to_owned(),
            })
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            text,
            config,
        })
    }

    /// The value of `setting` if `ok` holds of it; otherwise an error at its place in the
    /// file naming `field` and what it may be (`allowed`).
    fn within<T: Copy>(
        &self,
        setting: &Spanned<T>,
        ok: impl FnOnce(T) -> bool,
        field: String,
        allowed: impl fmt::Display,
    ) -> anyhow::Result<T> {
        let value = *setting.get_ref();
        if ok(value) {
            Ok(value)
        } else {
            Err(self.error(Some(setting.span().start), field, allowed))
        }
    }

    /// An error found after parsing, at a byte offset of the text if it is about one place.
    fn error(
        &self,
        offset: Option<usize>,
        field: impl Into<String>,
        message: impl fmt::Display,
    ) -> anyhow::Error {
        anyhow::Error::new(ConfigError {
            file: self.path.clone(),
            position: offset.map(|o| position(&self.text, o)),
            field: Some(field.into()),
            message: message.to_string(),
        })
    }

    /// The byte offset of the value at `path` in the file (`["api", "token_file"]`; a
    /// number steps into an array of tables, `["filter", "0"]`), for errors found after
    /// parsing about a field that carries no position of its own. Only errors pay for it.
    fn locate(&self, path: &[&str]) -> Option<usize> {
        let document = toml_edit::ImDocument::parse(self.text.as_str()).ok()?;
        let mut item: &toml_edit::Item = document.as_item();
        for step in path {
            item = match (step.parse::<usize>(), item) {
                (Ok(i), toml_edit::Item::ArrayOfTables(tables)) => {
                    return tables.get(i)?.span().map(|s| s.start);
                }
                _ => item.get(step)?,
            };
        }
        item.span().map(|s| s.start)
    }

    /// [`Loaded::error`] at the value at `path`, if the file has it.
    fn error_at(&self, path: &[&str], message: impl fmt::Display) -> anyhow::Error {
        self.error(self.locate(path), path.join("."), message)
    }

    /// The API's settings, if the file has an `[api]` table.
    pub(crate) fn api(&self) -> Result<Option<ApiConfig>> {
        let Some(a) = &self.config.api else {
            return Ok(None);
        };
        let mut tokens: Vec<String> = a.tokens.iter().map(|t| t.get_ref().clone()).collect();
        for t in &a.tokens {
            if t.get_ref().len() < MIN_TOKEN_LEN {
                return Err(self.error(
                    Some(t.span().start),
                    "api.tokens",
                    format!("a token must have at least {MIN_TOKEN_LEN} characters (wsx gentoken makes one)"),
                ));
            }
        }
        if let Some(file) = &a.token_file {
            let text = std::fs::read_to_string(file).map_err(|e| {
                self.error_at(
                    &["api", "token_file"],
                    format!("reading {}: {e}", file.display()),
                )
            })?;
            for line in text.lines().map(str::trim) {
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                if line.len() < MIN_TOKEN_LEN {
                    return Err(self.error_at(
                        &["api", "token_file"],
                        format!(
                            "{}: a token must have at least {MIN_TOKEN_LEN} characters",
                            file.display()
                        ),
                    ));
                }
                tokens.push(line.to_owned());
            }
        }
        let mut api = ApiConfig::new(tokens);
        api.listen = a.listen;
        api.tls = match (&a.tls_cert, &a.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            }),
            (None, None) => None,
            _ => {
                let given = if a.tls_cert.is_some() {
                    "tls_cert"
                } else {
                    "tls_key"
                };
                return Err(self.error(
                    self.locate(&["api", given]),
                    "api",
                    "give both tls_cert and tls_key, or neither",
                ));
            }
        };
        Ok(Some(api))
    }

    /// Checks what parsing cannot and builds the gateway's configuration.
    pub(crate) fn gateway(&self) -> Result<GatewayConfig> {
        let c = &self.config;
        let secret = match (&c.tunnel.private_key, &c.tunnel.private_key_file) {
            (Some(key), None) => key.get_ref().0.clone(),
            (None, Some(file)) => {
                let text = std::fs::read_to_string(file).map_err(|e| {
                    self.error_at(
                        &["tunnel", "private_key_file"],
                        format!("reading {}: {e}", file.display()),
                    )
                })?;
                text.parse().map_err(|e| {
                    self.error_at(
                        &["tunnel", "private_key_file"],
                        format!("{}: not a private key: {e}", file.display()),
                    )
                })?
            }
            (Some(key), Some(_)) => {
                return Err(self.error(
                    Some(key.span().start),
                    "tunnel",
                    "give private_key or private_key_file, not both",
                ));
            }
            (None, None) => {
                // At the [tunnel] table if there is one.
                return Err(self.error(
                    self.locate(&["tunnel"]),
                    "tunnel",
                    "private_key or private_key_file is required",
                ));
            }
        };
        let mut gateway = GatewayConfig::new(secret, c.tunnel.listen);
        if let Some(mbit) = c.tunnel.max_rate_mbit {
            if !(mbit > 0.0 && mbit.is_finite()) {
                return Err(
                    self.error_at(&["tunnel", "max_rate_mbit"], "must be a positive number")
                );
            }
            gateway.transport.max_rate = Some((mbit * 1e6 / 8.0) as u64);
        }
        if let Some(size) = c.tunnel.max_datagram {
            if !(MIN_DATAGRAM..=MAX_DATAGRAM).contains(&size) {
                return Err(self.error_at(
                    &["tunnel", "max_datagram"],
                    format!("must be {MIN_DATAGRAM} to {MAX_DATAGRAM} bytes"),
                ));
            }
            gateway.transport.max_datagram = size;
        }
        gateway.transport.aes_gcm = c.tunnel.cipher == CipherChoice::Auto;
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
            let zero = [
                ("port", i.port == 0),
                ("mark", i.mark == 0),
                ("route_table", i.route_table == 0),
            ]
            .into_iter()
            .find_map(|(field, zero)| zero.then_some(field));
            if let Some(field) = zero {
                return Err(self.error_at(&["intercept", field], "must be non-zero"));
            }
        }
        let s = &c.sessions;
        if s.max_sessions == 0 || s.relay_buffer_kib == 0 {
            let zero = if s.max_sessions == 0 {
                "max_sessions"
            } else {
                "relay_buffer_kib"
            };
            return Err(self.error_at(&["sessions", zero], "must be non-zero"));
        }
        if s.memory_budget_mib.is_some_and(|mib| mib < 16) {
            return Err(self.error_at(&["sessions", "memory_budget_mib"], "at least 16 (MiB)"));
        }
        if s.health_timeout < Duration::from_millis(200) {
            return Err(self.error_at(&["sessions", "health_timeout"], "at least 200ms"));
        }
        // Rules and privileges only where asked for: a gateway that intercepts (and so
        // has them anyway) or one told to.
        gateway.transparent_origin = s.transparent_origin.unwrap_or(gateway.intercept.is_some());
        let mut sessions = SessionConfig::default();
        sessions.max_sessions = s.max_sessions;
        sessions.relay_buffer = s.relay_buffer_kib * 1024;
        if let Some(mib) = s.memory_budget_mib {
            sessions.memory_budget = mib.saturating_mul(1 << 20);
        }
        sessions.connect_timeout = s.connect_timeout;
        sessions.idle_timeout = s.idle_timeout;
        sessions.tcp_keepalive = (!s.tcp_keepalive.is_zero()).then_some(s.tcp_keepalive);
        sessions.health_timeout = s.health_timeout;
        gateway.sessions = sessions;
        for (i, p) in c.peers.iter().enumerate() {
            let mut peer = PeerConfig::new(p.name.get_ref().clone(), p.public_key.get_ref().0);
            peer.endpoint = p.endpoint;
            peer.prefixes = p.prefixes.clone();
            peer.secondary = p.secondary.as_ref().map(|s| s.get_ref().clone());
            peer.on_failure = match p.on_failure {
                OnFailure::Bypass => FailurePolicy::Bypass,
                OnFailure::Reject => FailurePolicy::Reject,
            };
            peer.force_bypass = p.force_bypass;
            let field = |name: &str| format!("peer[{i}].{name}");
            let level = self.within(
                &p.compression_level,
                |l| (1..=9).contains(&l),
                field("compression_level"),
                "1 (fastest) to 9 (smallest)",
            )?;
            peer.compression = p.compression.then_some(level);
            peer.fec = match p.fec {
                Fec::Off => FecMode::Off,
                Fec::On => FecMode::On,
                Fec::Adaptive => FecMode::Adaptive,
            };
            peer.fec_max_overhead = self.within(
                &p.fec_max_overhead,
                |o| o > 0.0 && o <= 1.0,
                field("fec_max_overhead"),
                "above 0 and at most 1 (parity packets per data packet)",
            )?;
            peer.smb = p.smb;
            let read_ahead = self.within(
                &p.smb_read_ahead_mib,
                |mib| mib <= MAX_SMB_READ_AHEAD_MIB,
                field("smb_read_ahead_mib"),
                format!("0 (none) to {MAX_SMB_READ_AHEAD_MIB}"),
            )?;
            peer.smb_read_ahead = read_ahead << 20;
            peer.smb_validity_ms = self.within(
                &p.smb_validity_ms,
                |ms| ms <= MAX_SMB_VALIDITY_MS,
                field("smb_validity_ms"),
                format!("0 (protected files only) to {MAX_SMB_VALIDITY_MS}"),
            )?;
            gateway.peers.push(peer);
        }
        for (i, f) in c.forwards.iter().enumerate() {
            let name = f.name.get_ref();
            if name.is_empty() || c.forwards[..i].iter().any(|o| o.name.get_ref() == name) {
                return Err(self.error(
                    Some(f.name.span().start),
                    format!("forward[{i}].name"),
                    "must be set and differ from the other forwards' names",
                ));
            }
            let to = parse_target(f.to.get_ref())
                .map_err(|e| self.error(Some(f.to.span().start), format!("forward[{i}].to"), e))?;
            if c.forwards[..i].iter().any(|o| o.listen == f.listen) {
                return Err(self.error(
                    Some(f.name.span().start),
                    format!("forward[{i}].listen"),
                    format!("{} is used by another forward", f.listen),
                ));
            }
            gateway.forwards.push(wsx_proxy::ForwardConfig::new(
                name.clone(),
                f.listen,
                to,
                f.peer.get_ref().clone(),
            ));
        }
        for (i, x) in c.socks.iter().enumerate() {
            let name = x.name.get_ref();
            if name.is_empty() || c.socks[..i].iter().any(|o| o.name.get_ref() == name) {
                return Err(self.error(
                    Some(x.name.span().start),
                    format!("socks[{i}].name"),
                    "must be set and differ from the other SOCKS listeners' names",
                ));
            }
            let listens = c.forwards.iter().map(|f| f.listen);
            if listens
                .chain(c.socks[..i].iter().map(|o| o.listen))
                .any(|l| l == x.listen)
            {
                return Err(self.error(
                    Some(x.name.span().start),
                    format!("socks[{i}].listen"),
                    format!("{} is used by another listener", x.listen),
                ));
            }
            for (j, u) in x.users.iter().enumerate() {
                // RFC 1929 carries each in one length byte.
                if !(1..=255).contains(&u.name.len()) || !(1..=255).contains(&u.password.len()) {
                    return Err(self.error(
                        Some(x.name.span().start),
                        format!("socks[{i}].users[{j}]"),
                        "name and password must each be 1 to 255 bytes",
                    ));
                }
            }
            let peer = x.peer.get_ref().clone();
            let mut socks = wsx_proxy::SocksConfig::new(name.clone(), x.listen, peer);
            socks.users = x
                .users
                .iter()
                .map(|u| wsx_proxy::SocksUser {
                    name: u.name.clone(),
                    password: u.password.clone(),
                })
                .collect();
            gateway.socks.push(socks);
        }
        // The gateway's own check of the peers and the listeners' references to them,
        // reported at the field it is about.
        gateway.validate_peers().map_err(|e| self.peer_error(&e))?;
        gateway.shaping = self.shaping()?;
        Ok(gateway)
    }

    /// `e`, found in the gateway configuration built from this file (whose peers, forwards
    /// and SOCKS listeners are the file's, in order), as an error at its field.
    fn peer_error(&self, e: &PeerConfigError) -> anyhow::Error {
        let c = &self.config;
        let at = |s: Option<&Spanned<String>>| s.map(|s| s.span().start);
        let name_at = |i: usize| at(c.peers.get(i).map(|p| &p.name));
        let key_at = |i: usize| c.peers.get(i).map(|p| p.public_key.span().start);
        match e {
            PeerConfigError::EmptyName { index } => self.error(
                name_at(*index),
                format!("peer[{index}].name"),
                "must not be empty",
            ),
            PeerConfigError::SharedName { index, name } => self.error(
                name_at(*index),
                format!("peer[{index}].name"),
                format!("\"{name}\" is used by another peer"),
            ),
            PeerConfigError::SharedKey { index, .. } => self.error(
                key_at(*index),
                format!("peer[{index}].public_key"),
                "used by another peer",
            ),
            PeerConfigError::OwnKey { index, .. } => self.error(
                key_at(*index),
                format!("peer[{index}].public_key"),
                "this is the gateway's own key",
            ),
            PeerConfigError::Secondary {
                index, secondary, ..
            } => self.error(
                at(c.peers.get(*index).and_then(|p| p.secondary.as_ref())),
                format!("peer[{index}].secondary"),
                format!("\"{secondary}\" is not another peer's name"),
            ),
            PeerConfigError::UnknownPeer {
                kind, index, peer, ..
            } => {
                let (field, span) = match kind {
                    ListenerKind::Forward => ("forward", c.forwards.get(*index).map(|f| &f.peer)),
                    ListenerKind::Socks => ("socks", c.socks.get(*index).map(|s| &s.peer)),
                    _ => ("listener", None),
                };
                self.error(
                    at(span),
                    format!("{field}[{index}].peer"),
                    format!("\"{peer}\" is not a peer's name"),
                )
            }
            other => self.error(self.locate(&["peer", "0"]), "peer", other),
        }
    }
}

/// Line and column (1-based) of a byte offset.
fn position(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
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
        // Nothing intercepts, nothing asks for it: no rules, no privileges.
        assert!(!c.transparent_origin);
        assert_eq!(c.sessions, SessionConfig::default());
        let c = parse(&format!(
            "[tunnel]\nprivate_key = \"{KEY_A}\"\n[intercept]\n"
        ))
        .unwrap();
        assert!(c.transparent_origin, "on by default where it intercepts");
        let c = parse(&format!(
            "[tunnel]\nprivate_key = \"{KEY_A}\"\n[sessions]\ntransparent_origin = true\n"
        ))
        .unwrap();
        assert!(c.transparent_origin, "asked for without interception");
    }

    #[test]
    fn the_memory_budget_is_the_host_s_quarter_unless_set() {
        let c = parse(&format!("[tunnel]\nprivate_key = \"{KEY_A}\"\n")).unwrap();
        assert_eq!(
            c.sessions.memory_budget,
            wsx_proxy::sys::default_memory_budget()
        );
        let c = parse(&format!(
            "[tunnel]\nprivate_key = \"{KEY_A}\"\n[sessions]\nmemory_budget_mib = 100\n"
        ))
        .unwrap();
        assert_eq!(c.sessions.memory_budget, 100 << 20);
    }

    #[test]
    fn aes_gcm_is_offered_unless_the_cipher_is_pinned_to_chacha20_poly1305() {
        let base = format!("[tunnel]\nprivate_key = \"{KEY_A}\"\n");
        assert!(parse(&base).unwrap().transport.aes_gcm);
        let auto = parse(&format!("{base}cipher = \"auto\"\n")).unwrap();
        assert!(auto.transport.aes_gcm);
        let chacha = parse(&format!("{base}cipher = \"chacha20-poly1305\"\n")).unwrap();
        assert!(!chacha.transport.aes_gcm);
        let e = parse(&format!("{base}cipher = \"aes-128-cbc\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tunnel.cipher") && e.contains("chacha20-poly1305"),
            "{e}"
        );
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
max_datagram = 1300

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
        assert_eq!(c.transport.max_datagram, 1300);
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
        assert!(c.peers[0].smb, "SMB sessions are watched by default");
        assert!(!parse(&peer("smb = false")).unwrap().peers[0].smb);
        let e = parse(&peer("smb = 1")).unwrap_err().to_string();
        assert!(e.starts_with("wsx.toml:6:7: "), "{e}");
        assert_eq!(c.peers[0].smb_read_ahead, 8 << 20);
        let c = parse(&peer("smb_read_ahead_mib = 0")).unwrap();
        assert_eq!(c.peers[0].smb_read_ahead, 0);
        assert_eq!(c.peers[0].smb_validity_ms, 1000);
        let c = parse(&peer("smb_validity_ms = 0")).unwrap();
        assert_eq!(c.peers[0].smb_validity_ms, 0);
        let e = parse(&peer("smb_validity_ms = 10001"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("peer[0].smb_validity_ms: 0 (protected files only) to 10000"),
            "{e}"
        );
        let e = parse(&peer("smb_read_ahead_mib = 257"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "wsx.toml:6:22: peer[0].smb_read_ahead_mib: 0 (none) to 256"
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
        let text = format!("[tunnel]\nprivate_key = \"{KEY_A}\"\nmax_datagram = 1000\n");
        let e = parse(&text).unwrap_err().to_string();
        assert!(
            e.ends_with("tunnel.max_datagram: must be 1200 to 9216 bytes"),
            "{e}"
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
    fn peer_names_and_keys_are_checked_at_their_field() {
        let k = peer_key();
        let two = |name: &str, key: &str| {
            format!(
                "[tunnel]\nprivate_key = \"{KEY_A}\"\n[[peer]]\nname = \"a\"\npublic_key = \"{k}\"\n[[peer]]\nname = \"{name}\"\npublic_key = \"{key}\"\n"
            )
        };
        let e = parse(&two("b", &k)).unwrap_err().to_string();
        assert_eq!(e, "wsx.toml:8:14: peer[1].public_key: used by another peer");
        let own = KEY_A.parse::<SecretKey>().unwrap().public_key().to_string();
        let e = parse(&two("b", &own)).unwrap_err().to_string();
        assert_eq!(
            e,
            "wsx.toml:8:14: peer[1].public_key: this is the gateway's own key"
        );
        let e = parse(&two("", &peer_key())).unwrap_err().to_string();
        assert_eq!(e, "wsx.toml:7:8: peer[1].name: must not be empty");
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

    #[test]
    fn secrets_are_masked_in_the_json_the_api_shows() {
        let token = "a-token-of-some-length";
        let loaded = Loaded::parse(
            Path::new("wsx.toml"),
            format!("[tunnel]\nprivate_key = \"{KEY_A}\"\n[api]\ntokens = [\"{token}\"]\n"),
        )
        .unwrap();
        let json = serde_json::to_string(&loaded.config).unwrap();
        assert!(!json.contains(KEY_A) && !json.contains(token), "{json}");
        assert!(json.contains("\"private_key\":\"<secret>\""), "{json}");
        assert!(json.contains("\"tokens\":[\"<secret>\"]"), "{json}");
        // Defaults are filled in.
        assert!(json.contains("\"max_sessions\":"), "{json}");
    }

    #[test]
    fn the_api_section_is_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("api.token");
        std::fs::write(&file, "# operators\nfile-token-0123456789\n\n").unwrap();
        let text = |api: &str| format!("[tunnel]\nprivate_key = \"{KEY_A}\"\n[api]\n{api}\n");
        let loaded = |api: &str| Loaded::parse(Path::new("wsx.toml"), text(api)).unwrap();
        let api = loaded(&format!(
            "listen = \"[::1]:9999\"\ntokens = [\"inline-token-0123456\"]\ntoken_file = \"{}\"",
            file.display()
        ))
        .api()
        .unwrap()
        .unwrap();
        assert_eq!(api.listen, "[::1]:9999".parse().unwrap());
        assert_eq!(
            api.tokens,
            ["inline-token-0123456", "file-token-0123456789"]
        );
        let api = loaded("").api().unwrap().unwrap();
        assert_eq!(api.listen, ApiConfig::DEFAULT_LISTEN);
        assert!(api.tokens.is_empty());
        let none = Loaded::parse(
            Path::new("wsx.toml"),
            format!("[tunnel]\nprivate_key = \"{KEY_A}\"\n"),
        );
        assert!(none.unwrap().api().unwrap().is_none());
        let e = loaded("tokens = [\"short\"]")
            .api()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("wsx.toml:4:11: api.tokens: a token must have at least 16"),
            "{e}"
        );
        let e = loaded("tls_cert = \"/x.pem\"")
            .api()
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "wsx.toml:4:12: api: give both tls_cert and tls_key, or neither"
        );
        let e = loaded("token_file = \"/nonexistent/api.token\"")
            .api()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("wsx.toml:4:14: api.token_file: reading /nonexistent/api.token"),
            "{e}"
        );
    }

    /// Every check made after parsing points at the value it is about.
    #[test]
    fn errors_found_after_parsing_name_line_and_column() {
        // After "[tunnel]\nprivate_key = ...\n": the table of each case starts on line 3.
        let cases = [
            (
                "[sessions]\nhealth_timeout = \"10ms\"\n",
                "wsx.toml:4:18: sessions.health_timeout:",
            ),
            (
                "[sessions]\nmax_sessions = 0\n",
                "wsx.toml:4:16: sessions.max_sessions:",
            ),
            (
                "[sessions]\nmemory_budget_mib = 8\n",
                "wsx.toml:4:21: sessions.memory_budget_mib: at least 16",
            ),
            (
                "[intercept]\nmark = 0\n",
                "wsx.toml:4:8: intercept.mark: must be non-zero",
            ),
            (
                "[[filter]]\nscenario = \"x\"\n",
                "wsx.toml:3:1: filter[0]: filters need a [shaper] table",
            ),
        ];
        for (extra, expected) in cases {
            let text = format!("[tunnel]\nprivate_key = \"{KEY_A}\"\n{extra}");
            let e = parse(&text).unwrap_err().to_string();
            assert!(e.starts_with(expected), "{text}\n{e}");
        }
        for (field, expected) in [
            (
                "max_datagram = 900",
                "wsx.toml:2:16: tunnel.max_datagram: must be",
            ),
            (
                "max_rate_mbit = -1.0",
                "wsx.toml:2:17: tunnel.max_rate_mbit:",
            ),
        ] {
            let text = format!("[tunnel]\n{field}\nprivate_key = \"{KEY_A}\"\n");
            let e = parse(&text).unwrap_err().to_string();
            assert!(e.starts_with(expected), "{text}\n{e}");
        }
        let e = parse("[tunnel]\nlisten = \"[::]:4500\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("wsx.toml:1:1: tunnel: private_key or private_key_file is required"),
            "{e}"
        );
    }

    #[test]
    fn forwarding_listeners_are_read_and_checked() {
        let text = |forward: &str| {
            format!(
                "[tunnel]\nprivate_key = \"{KEY_A}\"\n[[peer]]\nname = \"hq\"\npublic_key = \"{}\"\n[[forward]]\nname = \"files\"\nlisten = \"127.0.0.1:8445\"\npeer = \"hq\"\n{forward}\n",
                peer_key()
            )
        };
        let c = parse(&text("to = \"files.example.net:445\"")).unwrap();
        assert_eq!(
            c.forwards[0].to,
            wsx_tunnel::Target::Name {
                host: "files.example.net".into(),
                port: 445
            }
        );
        assert!(c.intercept.is_none());
        let c = parse(&text("to = \"[fd00::5]:80\"")).unwrap();
        assert_eq!(
            c.forwards[0].to,
            wsx_tunnel::Target::Addr("[fd00::5]:80".parse().unwrap())
        );
        for bad in ["no-port", "a..b:80", "host:0", "host:99999", "exa mple:80"] {
            let e = parse(&text(&format!("to = \"{bad}\"")))
                .unwrap_err()
                .to_string();
            assert!(e.contains("forward[0].to"), "{bad}: {e}");
        }
        let e = parse(&text("to = \"x:1\"").replace("peer = \"hq\"\nto", "peer = \"nobody\"\nto"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("forward[0].peer: \"nobody\" is not a peer's name"),
            "{e}"
        );
    }

    #[test]
    fn socks_listeners_are_read_and_their_passwords_masked() {
        let text = format!(
            "[tunnel]\nprivate_key = \"{KEY_A}\"\n[[peer]]\nname = \"hq\"\npublic_key = \"{}\"\n[[socks]]\nname = \"apps\"\nlisten = \"[::1]:1080\"\npeer = \"hq\"\nusers = [{{ name = \"alice\", password = \"pa55word\" }}]\n",
            peer_key()
        );
        let c = parse(&text).unwrap();
        assert_eq!(c.socks[0].listen, "[::1]:1080".parse().unwrap());
        assert_eq!(c.socks[0].users[0].name, "alice");
        let loaded = Loaded::parse(Path::new("wsx.toml"), text.clone()).unwrap();
        let json = serde_json::to_string(&loaded.config).unwrap();
        assert!(
            !json.contains("pa55word") && json.contains("<secret>"),
            "{json}"
        );
        let e = parse(&text.replace("password = \"pa55word\"", "password = \"\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("socks[0].users[0]"), "{e}");
        let e = parse(&text.replace("peer = \"hq\"\nusers", "peer = \"x\"\nusers"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("socks[0].peer"), "{e}");
    }

    #[test]
    fn errors_carry_the_field_and_position_for_the_api() {
        let e = parse(&format!(
            "[tunnel]\nprivate_key = \"{KEY_A}\"\n[sessions]\nmax_sessions = \"many\"\n"
        ))
        .unwrap_err();
        let c = e.downcast_ref::<ConfigError>().unwrap();
        assert_eq!(c.field.as_deref(), Some("sessions.max_sessions"));
        assert_eq!(c.position, Some((4, 16)));
    }
}
