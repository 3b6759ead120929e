//! What identifies a stream on the wire and what it carries at open: [`StreamId`],
//! [`StreamMeta`] and the far gateway's [`Target`] (PROTOCOL.md §4, OPEN).

use std::fmt;
use std::net::SocketAddr;

/// The longest application hint an OPEN frame carries.
pub const MAX_HINT_LEN: usize = 255;
/// The longest destination name an OPEN frame carries (a DNS name is at most 253).
pub const MAX_NAME_LEN: usize = 255;

/// Identifies a stream within a connection. The low bit tells which side opened it (0: the
/// side that initiated the connection); the rest is a counter, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub(crate) u64);

impl StreamId {
    pub(crate) fn new(initiator: bool, index: u64) -> Self {
        Self(index << 1 | u64::from(!initiator))
    }

    /// Whether the connection's initiator opened this stream.
    pub fn opened_by_initiator(self) -> bool {
        self.0 & 1 == 0
    }

    pub(crate) fn index(self) -> u64 {
        self.0 >> 1
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<StreamId> for u64 {
    fn from(id: StreamId) -> u64 {
        id.0
    }
}

/// What a stream carries besides its bytes, sent when it is opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamMeta {
    /// The TCP client's address, as the gateway that accepted it saw it.
    pub source: Option<SocketAddr>,
    /// Where the far gateway connects: the address the client connected to, or a name.
    pub destination: Option<Target>,
    /// The client was intercepted on the near gateway's LAN, so the far gateway may connect
    /// from its address (transparent origin). False for clients of an explicit entry point
    /// (a forwarding listener, SOCKS), whose address means nothing at the far site.
    pub transparent: bool,
    /// The shaping scenario the connection was classified into.
    pub scenario: u32,
    /// Up to [`MAX_HINT_LEN`] bytes for the application (e.g. "smb2").
    pub hint: Vec<u8>,
}

/// Where the far gateway connects a stream.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// An address: an intercepted connection's original destination, or a literal.
    Addr(SocketAddr),
    /// A host name, 1 to [`MAX_NAME_LEN`] bytes, that the far gateway resolves.
    Name { host: String, port: u16 },
}

impl Target {
    pub fn port(&self) -> u16 {
        match self {
            Target::Addr(a) => a.port(),
            Target::Name { port, .. } => *port,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Addr(a) => write!(f, "{a}"),
            Target::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl From<SocketAddr> for Target {
    fn from(a: SocketAddr) -> Self {
        Target::Addr(a)
    }
}
