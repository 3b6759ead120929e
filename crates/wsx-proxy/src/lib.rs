//! The gateway side of wsx: transparent interception of TCP connections, relaying them as
//! streams of a [`wsx_tunnel`] tunnel to a peer gateway, re-originating inbound streams to
//! their servers, and bypass when the peer is down.
//!
//! # Architecture
//!
//! - [`rules`]: the nftables table and policy routing that send new TCP connections toward
//!   the configured remote prefixes to the gateway's transparent listeners, and the packets
//!   of its transparent sockets to it. Installed on start, removed on stop, leftovers of a
//!   crashed run removed first.
//! - [`sys`]: every socket option (transparent listeners and binds, keepalive, resets).
//! - [`addrs`]: [`ClientAddr`] and [`OrigDstAddr`], so the two are never confused.
//! - `peers`: peer gateways, selection by longest destination prefix, health from tunnel
//!   silence, the secondary peer.
//! - `chunked`: session data on tunnel streams as chunks, deflated where that pays
//!   ([`wsx_compress`]), with per-peer counters ([`CompressionStats`]).
//! - `socks`: the server side of a SOCKS5 handshake (CONNECT, RFC 1928; RFC 1929
//!   authentication), for SOCKS listeners.
//! - `relay`: client ↔ stream (or ↔ server, when bypassing) with bounded buffers, half-close
//!   and reset propagation, byte counts and an idle timeout.
//! - `session`: the table of live sessions (each can be killed), and the gateway's running
//!   totals: sessions opened, ended and refused, bytes by peer and route.
//! - `config`: [`GatewayConfig`] and its parts, and the one check of the peers and the
//!   listeners' references to them ([`GatewayConfig::validate_peers`]).
//! - `listener`: the entry points (transparent interception, forwarding listeners, SOCKS5
//!   listeners) behind one trait, and the one accept loop they share.
//! - `routing`: where a new connection goes (tunnel, secondary, bypass, reject), a pure
//!   function with a test per branch.
//! - `shaping`: the bandwidth controller ([`wsx_shaper`]) at work: sessions classified into
//!   scenarios, tunnel streams served by the shaper's turns (a scheduler installed in each
//!   tunnel), direct relays writing only against its grants (a pump on a timerfd).
//! - `smb`: sessions to TCP 445 watched by [`wsx_smb`]'s observer as the relay copies them
//!   (signed, encrypted or unsigned), relayed through the read-ahead engine's half when
//!   both gateways run it (`relay::copy_spliced`), and the gateway's counts ([`SmbStats`]).
//! - [`Gateway`] (`gateway/`): ties them together; its life (start, reload, shutdown) in
//!   `gateway/mod.rs`, the peer keeper in `gateway/keeper.rs`, outbound and inbound sessions
//!   in `gateway/sessions.rs`. See `gateway/mod.rs` for the data flow.
//!
//! The crate needs a tokio runtime; [`Gateway::start`] spawns its tasks on the current one.

pub mod addrs;
mod buffers;
mod chunked;
mod config;
mod every;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod gateway;
mod listener;
mod peers;
mod relay;
mod routing;
pub mod rules;
mod session;
mod shaping;
mod smb;
mod socks;
pub mod sys;

pub use addrs::{ClientAddr, OrigDstAddr};
pub use chunked::CompressionStats;
pub use config::{
    ForwardConfig, GatewayConfig, GatewayError, InterceptConfig, ListenerKind, MemoryBudget,
    PeerConfigError, SessionConfig, SocksConfig,
};
pub use gateway::{Gateway, MemoryStatus};
pub use peers::{DEFAULT_COMPRESSION_LEVEL, FailurePolicy, PeerConfig, PeerStatus, TunnelStatus};
pub use relay::code as reset_code;
pub use session::{Entry, GatewayTotals, Route, SessionInfo, SessionState, TrafficTotals};
pub use shaping::{
    DEFAULT_BUFFER, DEFAULT_SCENARIO, FilterStatus, MIN_FLOW_BUFFER, ScenarioStatus, ShaperStatus,
    ShapingConfig, ShapingError,
};
pub use smb::{
    DEFAULT_READ_AHEAD as DEFAULT_SMB_READ_AHEAD, DEFAULT_VALIDITY_MS as DEFAULT_SMB_VALIDITY_MS,
    SmbStats,
};
pub use socks::SocksUser;
pub use wsx_shaper;
pub use wsx_tunnel::Target;
