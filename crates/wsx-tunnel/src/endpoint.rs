//! The endpoint: one UDP socket's worth of connections. It runs the responder side of
//! handshakes and routes every other datagram to its connection by the receiver id in the
//! header; it never holds a connection itself (the driver owns them, as in quinn-proto), so
//! connections can be driven independently.

use crate::config::{EndpointConfig, TransportConfig};
use crate::congestion::PathHint;
use crate::connection::{self, Connection, PARAMS_MAX_LEN};
use crate::crypto::{self, PublicKey};
use crate::packet::{Header, INITIATION_HEADER_LEN, RESPONSE_HEADER_LEN};
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
}

/// See the module documentation.
#[derive(Debug)]
pub struct Endpoint {
    config: EndpointConfig,
    transport: Arc<TransportConfig>,
    public: PublicKey,
    rng: fastrand::Rng,
    next_handle: u64,
    entries: HashMap<ConnectionHandle, Entry>,
    by_id: HashMap<u32, ConnectionHandle>,
    by_peer: HashMap<PublicKey, ConnectionHandle>,
    /// The newest initiation timestamp accepted from each peer.
    timestamps: HashMap<PublicKey, u64>,
    hints: HashMap<PublicKey, PathHint>,
    stats: EndpointStats,
}

impl Endpoint {
    pub fn new(config: EndpointConfig) -> Self {
        Self {
            transport: Arc::new(config.transport.clone()),
            public: config.secret.public_key(),
            rng: fastrand::Rng::with_seed(config.seed),
            config,
            next_handle: 0,
            entries: HashMap::new(),
            by_id: HashMap::new(),
            by_peer: HashMap::new(),
            timestamps: HashMap::new(),
            hints: HashMap::new(),
            stats: EndpointStats::default(),
        }
    }

    pub fn public_key(&self) -> PublicKey {
        self.public
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
        let (handle, local_id) = self.register(peer, true);
        self.by_peer.insert(peer, handle);
        let connection = Connection::initiate(
            self.transport.clone(),
            now,
            unix_time,
            local_id,
            remote,
            self.config.secret.clone(),
            peer,
            self.hints.get(&peer).copied(),
        );
        Ok((handle, connection))
    }

    fn register(&mut self, peer: PublicKey, initiator: bool) -> (ConnectionHandle, u32) {
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
        let receiver = match header {
            Header::Initiation { sender } => return self.accept(now, from, sender, datagram),
            Header::Response { receiver, .. } => receiver,
            Header::Data(h) => h.receiver,
            Header::Parity { receiver } => receiver,
        };
        match self.by_id.get(&receiver) {
            Some(&handle) => Some(DatagramEvent::Route(handle)),
            None => {
                self.stats.unroutable += 1;
                None
            }
        }
    }

    fn accept(
        &mut self,
        now: Instant,
        from: SocketAddr,
        sender: u32,
        datagram: &[u8],
    ) -> Option<DatagramEvent> {
        let message = &datagram[INITIATION_HEADER_LEN..];
        // Initiations are padded to the initiator's datagram size.
        let mut payload = vec![0u8; message.len()];
        let header = &datagram[..INITIATION_HEADER_LEN];
        let (hs, peer, n) = match crypto::accept(&self.config.secret, header, message, &mut payload)
        {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::trace!(%from, error = %e, "initiation rejected");
                self.stats.handshakes_rejected += 1;
                return None;
            }
        };
        if !self.config.peers.contains(&peer) {
            tracing::debug!(%from, %peer, "initiation from an unknown key");
            self.stats.handshakes_rejected += 1;
            return None;
        }
        let Ok((timestamp, params)) = connection::parse_initiation_payload(&payload[..n]) else {
            self.stats.handshakes_rejected += 1;
            return None;
        };
        if self.timestamps.get(&peer).is_some_and(|&t| timestamp <= t) {
            self.stats.handshakes_replayed += 1;
            return None;
        }
        // Both sides initiating at once: the side with the larger key keeps its own attempt.
        let existing = self.by_peer.get(&peer).copied();
        if let Some(entry) = existing.and_then(|h| self.entries.get(&h)) {
            if entry.initiator && self.public > peer {
                return None;
            }
        }
        self.timestamps.insert(peer, timestamp);
        let (handle, local_id) = self.register(peer, false);
        // The answer is padded like the initiation, to the initiation's length or our own
        // datagram size if smaller (never larger than the request): a path that cannot carry
        // our data packets back fails the handshake too.
        let target = datagram.len().min(usize::from(self.transport.max_datagram));
        let padded = target.saturating_sub(RESPONSE_HEADER_LEN + crypto::RESPONSE_OVERHEAD);
        let mut params_out = vec![0u8; padded.max(4 + PARAMS_MAX_LEN)];
        let params_len =
            connection::response_payload(&self.transport, local_id, &mut params_out).max(padded);
        let mut response = vec![0u8; RESPONSE_HEADER_LEN + crypto::RESPONSE_OVERHEAD + params_len];
        let mut w = crate::coding::Writer::new(&mut response);
        Header::Response {
            sender: local_id,
            receiver: sender,
        }
        .emit(&mut w);
        let header_len = w.len();
        let (keys, n) =
            match crypto::respond(hs, &params_out[..params_len], &mut response[header_len..]) {
                Ok(done) => done,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot answer an initiation");
                    self.forget(handle, None);
                    return None;
                }
            };
        response.truncate(header_len + n);
        debug_assert!(
            response.len() <= datagram.len(),
            "the answer is never larger than the request"
        );
        self.stats.handshakes_accepted += 1;
        let replaces = self.by_peer.insert(peer, handle);
        let connection = Connection::accept(
            self.transport.clone(),
            now,
            local_id,
            sender,
            from,
            peer,
            keys,
            params,
            response,
            self.hints.get(&peer).copied(),
        );
        Some(DatagramEvent::NewConnection {
            handle,
            connection: Box::new(connection),
            replaces,
        })
    }
}
