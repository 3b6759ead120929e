//! The endpoint: one UDP socket's worth of connections. It runs the responder side of
//! handshakes and routes every other datagram to its connection by the receiver id in the
//! header; it never holds a connection itself (the driver owns them, as in quinn-proto), so
//! connections can be driven independently.

use crate::FastMap;
use crate::config::{EndpointConfig, TransportConfig};
use crate::congestion::PathHint;
use crate::connection::{Connection, Incoming, Rejected, Setup};
use crate::crypto::PublicKey;
use crate::wire::Header;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Names a connection of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnectionHandle(pub u64);

/// What to do with a datagram.
#[derive(Debug)]
#[non_exhaustive]
pub enum DatagramEvent {
    /// Hand it to this connection's `handle_datagram`.
    Route(ConnectionHandle),
    /// A peer completed a handshake initiation; the new connection's first transmit is the
    /// response. When the peer already had a connection (it restarted, or its earlier attempt
    /// lost our response), `replaces` names it: the driver ends it with
    /// [`Connection::replaced`] and drops it.
    NewConnection {
        handle: ConnectionHandle,
        connection: Box<Connection>,
        replaces: Option<ConnectionHandle>,
    },
}

/// Errors of [`Endpoint::connect`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The key is not one of the endpoint's peers.
    #[error("peer {0} is not configured")]
    UnknownPeer(PublicKey),
    /// The peer connected to this endpoint less than 10 s ago and that
    /// connection is not over: a second initiation from us would replace it at the peer,
    /// which takes an initiation from a key whose connection it holds for a restart (and
    /// what the connection carries would end with it). Wait for the peer's connection.
    #[error("peer {0} connected to this gateway a moment ago; its connection is on its way")]
    PeerConnecting(PublicKey),
}

/// Counters of the endpoint itself (datagrams no connection saw).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct EndpointStats {
    pub handshakes_accepted: u64,
    /// Initiations that failed to decrypt or came from unknown keys.
    pub handshakes_rejected: u64,
    /// Initiations not newer than the last accepted from the same peer.
    pub handshakes_replayed: u64,
    /// Datagrams with an unknown receiver id, or unparseable.
    pub unroutable: u64,
}

#[derive(Debug)]
struct Entry {
    local_id: u32,
    peer: PublicKey,
    initiator: bool,
    /// When this side started it.
    started: Instant,
    /// The peer answered this side's initiation: it holds the connection.
    answered: bool,
}

/// An initiation from a peer we started a connection to less than this long ago, and
/// that has not answered it, is taken for both sides initiating at once (the larger key
/// keeps its own attempt). A peer that answered ours, or that we have waited on longer,
/// has lost the connection (it restarted, or never got our initiation): its initiation
/// replaces ours. The other way round, for as long after accepting a peer's connection,
/// [`Endpoint::connect`] refuses to start one of ours.
pub(crate) const SIMULTANEOUS: std::time::Duration = std::time::Duration::from_secs(10);

/// See the module documentation.
#[derive(Debug)]
pub struct Endpoint {
    config: EndpointConfig,
    transport: Arc<TransportConfig>,
    public: PublicKey,
    rng: fastrand::Rng,
    next_handle: u64,
    entries: FastMap<ConnectionHandle, Entry>,
    by_id: FastMap<u32, ConnectionHandle>,
    by_peer: HashMap<PublicKey, ConnectionHandle>,
    /// The newest initiation timestamp accepted from each peer.
    timestamps: HashMap<PublicKey, u64>,
    hints: HashMap<PublicKey, PathHint>,
    stats: EndpointStats,
    /// Shutting down: initiations are dropped unanswered.
    refusing: bool,
    /// When ignored initiations were last logged, and how many were ignored since.
    rejections_logged: Option<Instant>,
    rejections_unlogged: u64,
}

/// Ignored initiations are logged at most this often (with the count in between): a
/// misconfigured peer retries every second, a scan may send many.
const REJECTION_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl Endpoint {
    pub fn new(config: EndpointConfig) -> Self {
        Self {
            transport: Arc::new(config.transport.clone()),
            public: config.secret.public_key(),
            rng: fastrand::Rng::with_seed(config.seed),
            config,
            next_handle: 0,
            entries: FastMap::default(),
            by_id: FastMap::default(),
            by_peer: HashMap::new(),
            timestamps: HashMap::new(),
            hints: HashMap::new(),
            stats: EndpointStats::default(),
            refusing: false,
            rejections_logged: None,
            rejections_unlogged: 0,
        }
    }

    pub fn public_key(&self) -> PublicKey {
        self.public
    }

    /// Takes no new connections from now on (the driver is shutting down): initiations are
    /// dropped unanswered, as a stopped gateway would. Connections already made go on.
    pub fn refuse_new(&mut self) {
        self.refusing = true;
    }

    /// Replaces the list of peers allowed to connect. Connections already made are kept; the
    /// caller closes those of peers it removed.
    pub fn set_peers(&mut self, peers: Vec<PublicKey>) {
        self.config.peers = peers;
    }

    pub fn stats(&self) -> EndpointStats {
        self.stats
    }

    pub fn transport_config(&self) -> &TransportConfig {
        &self.transport
    }

    /// Starts a connection to `peer` at `remote`. `unix_time` is the wall-clock time now.
    ///
    /// Refused while a connection the peer opened less than 10 s ago is still
    /// held ([`ConnectError::PeerConnecting`]): a gateway that checks for a connection before
    /// connecting can miss one accepted a moment before, still on its way to it.
    pub fn connect(
        &mut self,
        now: Instant,
        unix_time: Duration,
        remote: SocketAddr,
        peer: PublicKey,
    ) -> Result<(ConnectionHandle, Connection), ConnectError> {
        if !self.config.peers.contains(&peer) {
            return Err(ConnectError::UnknownPeer(peer));
        }
        let theirs = self.by_peer.get(&peer).and_then(|h| self.entries.get(h));
        if theirs.is_some_and(|e| {
            !e.initiator && now.saturating_duration_since(e.started) < SIMULTANEOUS
        }) {
            return Err(ConnectError::PeerConnecting(peer));
        }
        let (handle, local_id) = self.register(now, peer, true);
        self.by_peer.insert(peer, handle);
        let setup = self.setup(now, local_id, remote, peer);
        let connection = Connection::initiate(setup, unix_time, self.config.secret.clone());
        Ok((handle, connection))
    }

    fn setup(&self, now: Instant, local_id: u32, remote: SocketAddr, peer: PublicKey) -> Setup {
        Setup {
            config: self.transport.clone(),
            now,
            local_id,
            remote,
            peer,
            hint: self.hints.get(&peer).copied(),
        }
    }

    fn register(
        &mut self,
        now: Instant,
        peer: PublicKey,
        initiator: bool,
    ) -> (ConnectionHandle, u32) {
        let local_id = loop {
            let id = self.rng.u32(1..);
            if !self.by_id.contains_key(&id) {
                break id;
            }
        };
        let handle = ConnectionHandle(self.next_handle);
        self.next_handle += 1;
        self.entries.insert(
            handle,
            Entry {
                local_id,
                peer,
                initiator,
                started: now,
                answered: false,
            },
        );
        self.by_id.insert(local_id, handle);
        (handle, local_id)
    }

    /// A connection is over (drained or dropped): forget its id, and keep what it learned
    /// about the path for the next connection to the same peer.
    pub fn forget(&mut self, handle: ConnectionHandle, hint: Option<PathHint>) {
        let Some(entry) = self.entries.remove(&handle) else {
            return;
        };
        self.by_id.remove(&entry.local_id);
        if self.by_peer.get(&entry.peer) == Some(&handle) {
            self.by_peer.remove(&entry.peer);
        }
        if let Some(hint) = hint {
            self.hints.insert(entry.peer, hint);
        }
    }

    /// Decides what a received datagram is for. Handshake initiations are processed here;
    /// anything invalid is dropped without an answer (`None`).
    pub fn handle(
        &mut self,
        now: Instant,
        from: SocketAddr,
        datagram: &[u8],
    ) -> Option<DatagramEvent> {
        let header = match Header::parse(datagram) {
            Ok(h) => h,
            Err(_) => {
                self.stats.unroutable += 1;
                return None;
            }
        };
        let (receiver, response) = match header {
            Header::Initiation { .. } => return self.accept(now, from, datagram),
            Header::Response { receiver, .. } => (receiver, true),
            Header::Data(h) => (h.receiver, false),
            Header::Parity { receiver } => (receiver, false),
        };
        match self.by_id.get(&receiver) {
            Some(&handle) => {
                if response {
                    // Unauthenticated here, so it only lifts the tie-break in `accept`: the
                    // initiation it lets in is authenticated by its own handshake.
                    if let Some(entry) = self.entries.get_mut(&handle) {
                        entry.answered = true;
                    }
                }
                Some(DatagramEvent::Route(handle))
            }
            None => {
                self.stats.unroutable += 1;
                None
            }
        }
    }

    /// Says, at info and at most once per [`REJECTION_LOG_EVERY`], why an initiation from
    /// `from` was ignored: it came from a key that is not a configured peer's (`peer`), or
    /// it could not be read with this gateway's key (the sender has another public key for
    /// this gateway, or it is not a wsx peer at all).
    fn note_rejection(&mut self, now: Instant, from: SocketAddr, peer: Option<&PublicKey>) {
        if self
            .rejections_logged
            .is_some_and(|at| now.saturating_duration_since(at) < REJECTION_LOG_EVERY)
        {
            self.rejections_unlogged += 1;
            return;
        }
        let others = std::mem::take(&mut self.rejections_unlogged);
        self.rejections_logged = Some(now);
        match peer {
            Some(peer) => tracing::info!(
                %from, %peer, ignored_since_last = others,
                "handshake initiation from a key that is not one of this gateway's peers: ignored \
                 (add it as a [[peer]] public_key, or check the key the other side uses)"
            ),
            None => tracing::info!(
                %from, ignored_since_last = others,
                "handshake initiation that this gateway's key cannot read: ignored (does the \
                 other side have this gateway's current public key?)"
            ),
        }
    }

    /// Answers an initiation from a configured peer that is newer than the last one it
    /// sent; the handshake itself (Noise, parameters, padding) is `connection::Incoming`'s.
    fn accept(&mut self, now: Instant, from: SocketAddr, datagram: &[u8]) -> Option<DatagramEvent> {
        if self.refusing {
            return None;
        }
        let incoming = match Incoming::read(&self.config.secret, datagram) {
            Ok(incoming) => incoming,
            Err(e) => {
                self.stats.handshakes_rejected += 1;
                if let Rejected::Handshake(e) = &e {
                    tracing::trace!(%from, error = %e, "initiation rejected");
                    self.note_rejection(now, from, None);
                }
                return None;
            }
        };
        let peer = incoming.peer;
        if !self.config.peers.contains(&peer) {
            self.stats.handshakes_rejected += 1;
            self.note_rejection(now, from, Some(&peer));
            return None;
        }
        if self
            .timestamps
            .get(&peer)
            .is_some_and(|&t| incoming.timestamp <= t)
        {
            self.stats.handshakes_replayed += 1;
            return None;
        }
        // Both sides initiating at once: the side with the larger key keeps its own attempt.
        // A peer that initiates after answering ours has lost the connection (it
        // restarted): its newer initiation replaces it, however soon.
        let existing = self.by_peer.get(&peer).copied();
        if let Some(entry) = existing.and_then(|h| self.entries.get(&h)) {
            let recent = now.saturating_duration_since(entry.started) < SIMULTANEOUS;
            if entry.initiator && !entry.answered && recent && self.public > peer {
                return None;
            }
        }
        self.timestamps.insert(peer, incoming.timestamp);
        let (handle, local_id) = self.register(now, peer, false);
        let accepted = match incoming.respond(&self.transport, local_id) {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!(error = %e, "cannot answer an initiation");
                self.forget(handle, None);
                return None;
            }
        };
        self.stats.handshakes_accepted += 1;
        let replaces = self.by_peer.insert(peer, handle);
        let setup = self.setup(now, local_id, from, peer);
        let connection = Connection::accept(setup, accepted);
        Some(DatagramEvent::NewConnection {
            handle,
            connection: Box::new(connection),
            replaces,
        })
    }
}
