//! Sessions, both ways (the table that lists them is [`crate::session`]):
//!
//! - **outbound**: a connection an entry point admitted is routed ([`crate::routing`]),
//!   registered, and relayed through a tunnel stream or directly to its destination; the
//!   entry point tells its client the outcome through its [`EntryPoint::answer`] hook;
//! - **inbound**: a stream a peer opened is connected to its destination (from the client's
//!   address when the stream is transparent and the gateway re-originates) and relayed.
//!
//! Each holds a session slot for its life, and runs in a `session` span.

use super::{Inner, capacity};
use crate::addrs::ClientAddr;
use crate::chunked::{Chunked, Codec};
use crate::config::GatewayConfig;
use crate::listener::{Admission, Answer, EntryPoint, PeerSelector};
use crate::peers::Peer;
use crate::relay::{self, Outcome, Side, code};
use crate::routing::{self, Candidate, Decision};
use crate::session::{Ending, Entry, Route, Session, SessionState};
use crate::shaping::{Class, FlowGuard, Shaped};
use crate::smb::{self, Engine, Watch};
use crate::sys::{self, LanSocketOptions};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tracing::{Instrument, debug, info, info_span, warn};
use wsx_shaper::{Mode, SessionKey};
use wsx_tunnel::driver::{Stream, Tunnel};
use wsx_tunnel::{StreamMeta, Target};

impl Inner {
    /// An admitted connection: routed, registered, and relayed through the tunnel or
    /// directly; `entry_point` answers the client.
    pub(super) async fn outbound<E: EntryPoint>(
        self: Arc<Self>,
        entry_point: Arc<E>,
        mut tcp: TcpStream,
        client: ClientAddr,
        admission: Admission,
    ) {
        // No room for another session: refused at once, before it takes more. It may need
        // two descriptors until the tunnel carries it.
        let Some(mut holding) = self.capacity.hold(capacity::DIRECT) else {
            self.capacity.refused();
            self.sessions.totals.count(Ending::RefusedLimit);
            let _ = entry_point.answer(&mut tcp, Answer::Rejected).await;
            sys::abort(tcp);
            return;
        };
        let config = self.config();
        let options = LanSocketOptions {
            keepalive: config.sessions.tcp_keepalive,
        };
        if let Err(e) = sys::tune(&tcp, &options) {
            debug!(error = %e, "tuning the client socket");
        }
        let permit = self.slots.clone().try_acquire_owned().ok();
        if permit.is_none() {
            self.sessions.totals.count(Ending::RefusedLimit);
        }
        let Admission {
            destination,
            entry,
            peer: selector,
            transparent,
        } = admission;
        let peer_name = self.peer_name(&selector);
        let class = self.classify(Some(&tcp), client, &destination, peer_name.as_deref());
        if class.is_some_and(|c| c.mode == Mode::Discard) {
            info!(%client, %destination, "discarded by its scenario");
            self.sessions.totals.count(Ending::Discarded);
            let _ = entry_point.answer(&mut tcp, Answer::Rejected).await;
            sys::abort(tcp);
            return;
        }
        let to = (&destination, &selector, transparent);
        // A destination only the far side can mean is never relayed from here.
        let far_only = !transparent && routing::far_side_only(&destination);
        let carrier = match class {
            // The scenario relays it directly, whatever the peers.
            Some(c) if matches!(c.mode, Mode::Aggregate | Mode::Fixed) && !far_only => {
                let peer = self.peer_name(&selector);
                Ok(Carrier {
                    route: Route::Direct,
                    ..Carrier::direct(peer)
                })
            }
            _ => match self.route(client, to, permit.is_some(), class) {
                Ok(c) if c.stream.is_none() && far_only => {
                    info!(%client, %destination, "the far side's own address cannot be reached from here; refused while the tunnel cannot carry it");
                    Err(c.peer.unwrap_or_default())
                }
                other => other,
            },
        };
        let Carrier {
            peer,
            route,
            stream,
            flow,
            smb,
            engine,
        } = match carrier {
            Ok(carrier) => {
                if carrier.stream.is_some() {
                    holding.keep(capacity::TUNNEL);
                }
                carrier
            }
            Err(peer) => {
                info!(%client, %destination, %peer, "peer down; connection rejected");
                self.sessions.totals.count(Ending::RefusedPeerDown);
                let _ = entry_point.answer(&mut tcp, Answer::Rejected).await;
                sys::abort(tcp);
                return;
            }
        };
        let session = self.sessions.register(
            Instant::now(),
            client,
            (destination.clone(), entry.clone()),
            peer.clone(),
            route,
            self.kill.child_token(),
        );
        let span = info_span!("session", id = session.id, %client, %destination, %entry, route = route.as_str(), peer = peer.as_deref().unwrap_or("-"));
        async {
            info!("session opened");
            let outcome = match stream {
                Some(stream) => {
                    let answer = Answer::Connected { direct: None };
                    if let Err(e) = entry_point.answer(&mut tcp, answer).await {
                        debug!(error = %e, "client gone before its answer");
                        return;
                    }
                    hold_to(&tcp, flow.as_ref());
                    let engine = engine.then(|| Engine::near(self.smb.clone()));
                    let smb = relay::Smb {
                        watch: self.smb_watch(smb, destination.port()),
                        engine,
                    };
                    self.relay(&session, tcp, stream, smb).await
                }
                // Direct, and for an intercepted client still from its address (not its
                // port: that 4-tuple is the connection intercepted here; see `sys`).
                None => {
                    let from = transparent.then_some(SocketAddr::new(client.0.ip(), 0));
                    let to = (from, &destination);
                    let direct = self.direct(&*entry_point, &session, tcp, to, &config, class);
                    match direct.await {
                        Some(outcome) => outcome,
                        None => return,
                    }
                }
            };
            self.log_outcome(&session, outcome);
        }
        .instrument(span)
        .await;
        drop(flow);
        drop(permit);
        drop(holding);
    }

    /// The class of a session from `client` to `destination` through `peer`, if the
    /// gateway shapes. A destination given by name matches only prefixes that contain the
    /// unspecified address (`0.0.0.0/0`, `::/0`). The DSCP and the ingress interface are
    /// read from `tcp` when a filter looks at them; a session that came through the tunnel
    /// has neither.
    fn classify(
        &self,
        tcp: Option<&TcpStream>,
        client: ClientAddr,
        destination: &Target,
        peer: Option<&str>,
    ) -> Option<Class> {
        let shaping = self.shaping()?;
        let destination = match destination {
            Target::Addr(addr) => *addr,
            Target::Name { port, .. } => SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), *port),
        };
        let reads = shaping.reads();
        let arrival = match tcp.filter(|_| reads.dscp || reads.interface) {
            Some(tcp) => sys::arrival(tcp, client.0).unwrap_or_else(|e| {
                debug!(error = %e, "how the connection arrived is unknown");
                sys::Arrival::default()
            }),
            None => sys::Arrival::default(),
        };
        let interface = arrival
            .interface
            .filter(|_| reads.interface)
            .and_then(sys::interface_name);
        Some(shaping.classify(&SessionKey {
            source: client.0,
            destination,
            dscp: arrival.dscp,
            interface: interface.as_deref(),
            peer,
        }))
    }

    /// The name of the peer `selector` finds, if any.
    fn peer_name(&self, selector: &PeerSelector) -> Option<String> {
        let set = self.peer_set();
        let peer = match selector {
            PeerSelector::Prefix(ip) => set.table.lookup(*ip),
            PeerSelector::Named(name) => set.by_name(name),
        };
        peer.map(|p| p.config().name)
    }

    /// Where an admitted connection goes (`decide`): a stream of the chosen peer's tunnel,
    /// or the direct path; `Err` with the peer's name when its policy rejects the connection.
    fn route(
        &self,
        client: ClientAddr,
        (destination, selector, transparent): (&Target, &PeerSelector, bool),
        slot_free: bool,
        class: Option<Class>,
    ) -> Result<Carrier, String> {
        match self.decide(selector, slot_free) {
            Decision::Reject { peer } => Err(peer),
            Decision::Tunnel {
                peer,
                tunnel: Via { tunnel, codec, smb },
            } => {
                // The peer runs the read-ahead engine too: the stream carries its records.
                let engine = smb
                    && destination.port() == smb::PORT
                    && tunnel.peer_app_extensions() & smb::EXTENSION != 0;
                let meta = StreamMeta {
                    source: Some(client.0),
                    destination: Some(destination.clone()),
                    transparent,
                    hint: if engine {
                        smb::HINT.to_vec()
                    } else {
                        Vec::new()
                    },
                    ..StreamMeta::default()
                };
                match tunnel.open(meta) {
                    Ok(stream) => Ok(Carrier {
                        flow: self.stream_flow(&tunnel, &stream, class),
                        peer: Some(peer),
                        route: Route::Tunnel,
                        stream: Some(Chunked::new(stream, codec)),
                        smb,
                        engine,
                    }),
                    Err(e) => {
                        debug!(error = %e, %peer, "no stream; bypassing");
                        Ok(Carrier::direct(Some(peer)))
                    }
                }
            }
            Decision::Bypass { peer, reason } => {
                debug!(%client, %destination, reason = reason.as_str(), "bypass");
                Ok(Carrier::direct(peer))
            }
        }
    }

    /// Where a connection for the peer `selector` finds goes, given whether a session slot
    /// is free: the peer's tunnel, its secondary's, or its failure policy.
    fn decide(&self, selector: &PeerSelector, slot_free: bool) -> Decision<Via> {
        let health = self.config().sessions.health_timeout;
        let set = self.peer_set();
        let peer = match selector {
            PeerSelector::Prefix(ip) => set.table.lookup(*ip),
            PeerSelector::Named(name) => set.by_name(name),
        };
        routing::decide(slot_free, peer.map(|p| candidate(p, health)), |name| {
            set.by_name(name).map(|p| candidate(p, health))
        })
    }

    /// The direct path of an outbound session: connects to `destination` (from `from`, the
    /// client's address, when given), answers the client and relays. `None` if the session
    /// ended before relaying: the connect failed (the client is reset) or the client left.
    async fn direct<E: EntryPoint>(
        &self,
        entry_point: &E,
        session: &Session,
        mut tcp: TcpStream,
        (from, destination): (Option<SocketAddr>, &Target),
        config: &GatewayConfig,
        class: Option<Class>,
    ) -> Option<Outcome> {
        match sys::connect_target(from, destination, config.sessions.connect_timeout).await {
            Ok(server) => {
                let options = LanSocketOptions {
                    keepalive: config.sessions.tcp_keepalive,
                };
                let _ = sys::tune(&server, &options);
                mark(&server, class);
                let answer = Answer::Connected {
                    direct: Some(&server),
                };
                entry_point.answer(&mut tcp, answer).await.ok()?;
                // What goes to the server goes toward the WAN: it is shaped here.
                let shaped = class.zip(self.shaping());
                Some(match shaped {
                    Some((class, shaping)) => {
                        let flow = shaping.open_relay(class);
                        hold_to(&tcp, Some(&flow));
                        let buffer = usize::try_from(flow.buffer()).unwrap_or(usize::MAX);
                        let buffer = buffer.min(config.sessions.relay_buffer);
                        let server = Shaped::new(server, flow);
                        self.relay_with(session, tcp, server, buffer, relay::Smb::default())
                            .await
                    }
                    None => {
                        self.relay(session, tcp, server, relay::Smb::default())
                            .await
                    }
                })
            }
            Err(e) => {
                info!(error = %e, "bypass connect failed");
                self.sessions.totals.count(Ending::ConnectFailed);
                let _ = entry_point
                    .answer(&mut tcp, Answer::ConnectFailed(&e))
                    .await;
                sys::abort(tcp);
                None
            }
        }
    }

    /// A stream the peer opened: connect to its destination and relay.
    pub(super) async fn inbound(
        self: Arc<Self>,
        peer: Arc<Peer>,
        tunnel: Tunnel,
        mut stream: Stream,
    ) {
        let (codec, config) = (peer.codec(), peer.config());
        let (peer, smb, read_ahead, validity) = (
            config.name,
            config.smb,
            config.smb_read_ahead,
            config.smb_validity_ms,
        );
        let meta = stream.meta().clone();
        let (Some(source), Some(destination)) = (meta.source, meta.destination.clone()) else {
            stream.reset(code::REJECTED);
            return;
        };
        // What this gateway sends back goes toward the WAN through the tunnel: shaped in
        // the scenario this gateway's own filters give.
        let class = self.classify(None, ClientAddr(source), &destination, Some(&peer));
        if class.is_some_and(|c| c.mode == Mode::Discard) {
            info!(client = %source, %destination, "inbound session discarded by its scenario");
            self.sessions.totals.count(Ending::Discarded);
            stream.reset(code::REJECTED);
            return;
        }
        // The server's socket.
        let Some(holding) = self.capacity.hold(capacity::TUNNEL) else {
            self.capacity.refused();
            self.sessions.totals.count(Ending::RefusedLimit);
            stream.reset(code::REJECTED);
            return;
        };
        let flow = self.stream_flow(&tunnel, &stream, class);
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            warn!(%peer, "session limit reached; inbound stream refused");
            self.sessions.totals.count(Ending::RefusedLimit);
            stream.reset(code::REJECTED);
            return;
        };
        let config = self.config();
        let client = ClientAddr(source);
        let session = self.sessions.register(
            Instant::now(),
            client,
            (destination.clone(), Entry::Tunnel),
            Some(peer.clone()),
            Route::Inbound,
            self.kill.child_token(),
        );
        let span = info_span!("session", id = session.id, %client, %destination, entry = %Entry::Tunnel, route = "inbound", %peer);
        async {
            if meta.transparent
                && !config.transparent_origin
                && !self.origin_hinted.swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                info!(
                    "the peer intercepted this session transparently; it is re-originated from \
                     this gateway's address (set sessions.transparent_origin = true for the \
                     server to see the client's, if its replies route through this gateway)"
                );
            }
            // From the client's own address and port (see `sys`).
            let from = (config.transparent_origin && meta.transparent).then_some(client.0);
            let connect = sys::connect_target(from, &destination, config.sessions.connect_timeout);
            let connected = tokio::select! {
                r = connect => r,
                () = session.kill.cancelled() => Err(io::Error::new(io::ErrorKind::Interrupted, "session ended")),
            };
            match connected {
                Ok(server) => {
                    let options = LanSocketOptions { keepalive: config.sessions.tcp_keepalive };
                    if let Err(e) = sys::tune(&server, &options) {
                        debug!(error = %e, "tuning the server socket");
                    }
                    mark(&server, class);
                    // The server's data goes toward the WAN from here.
                    hold_to(&server, flow.as_ref());
                    info!("session opened");
                    let stream = Chunked::new(stream, codec);
                    // The peer's client side runs near: this gateway runs far (reading
                    // ahead only for a peer with `smb` on).
                    let engine = (meta.hint == smb::HINT).then(|| {
                        let window = if smb { read_ahead } else { 0 };
                        let mut engine =
                            Engine::far(window, self.smb.clone(), self.relay_buffers.clone());
                        engine.splice.set_validity(validity);
                        engine
                    });
                    let smb = relay::Smb {
                        watch: self.smb_watch(smb, destination.port()),
                        engine,
                    };
                    let outcome = self.relay(&session, stream, server, smb).await;
                    self.log_outcome(&session, outcome);
                }
                Err(e) => {
                    let reset = relay::connect_error_code(&e);
                    info!(error = %e, "connect failed; stream reset");
                    self.sessions.totals.count(Ending::ConnectFailed);
                    stream.reset(reset);
                }
            }
        }
        .instrument(span)
        .await;
        drop(flow);
        drop(permit);
        drop(holding);
    }

    /// The shaper's flow for `stream` of `tunnel`, if the gateway shapes; the stream then
    /// queues no more than the flow's share of its scenario's buffer, and the tunnel
    /// packets that carry it are marked with its scenario's DSCP.
    fn stream_flow(
        &self,
        tunnel: &Tunnel,
        stream: &Stream,
        class: Option<Class>,
    ) -> Option<FlowGuard> {
        let (shaping, class) = self.shaping().zip(class)?;
        if let Some(dscp) = class.dscp {
            // The tunnel packets that carry this session's data toward the WAN.
            stream.set_dscp(dscp);
        }
        let flow = shaping.open_stream(tunnel, stream.id(), class)?;
        stream.set_unsent_limit(flow.buffer());
        Some(flow)
    }

    /// An SMB observer for a session to `port` through the tunnel of a peer with `smb` on,
    /// if the port is SMB's.
    fn smb_watch(&self, smb: bool, port: u16) -> Option<Watch> {
        (smb && port == smb::PORT).then(|| Watch::new(self.smb.clone()))
    }

    /// Relays a session's two sides until they end, it idles out, the operator kills it or
    /// the drain deadline passes; `smb` watches it and runs its engine half.
    async fn relay(
        &self,
        session: &Session,
        client: impl Side,
        server: impl Side,
        smb: relay::Smb,
    ) -> Outcome {
        let buffer = self.config().sessions.relay_buffer;
        self.relay_with(session, client, server, buffer, smb).await
    }

    /// [`Self::relay`] with buffers of `buffer` bytes each way.
    async fn relay_with(
        &self,
        session: &Session,
        client: impl Side,
        server: impl Side,
        buffer: usize,
        smb: relay::Smb,
    ) -> Outcome {
        let config = self.config();
        let buffers = relay::Buffers {
            from: self.relay_buffers.clone(),
            size: buffer,
        };
        relay::relay(
            client,
            server,
            session,
            buffers,
            config.sessions.idle_timeout,
            smb,
            async {
                session.kill.cancelled().await;
                if self.kill.is_cancelled() {
                    Outcome::Shutdown
                } else {
                    Outcome::Killed
                }
            },
        )
        .await
    }

    /// Counts how a relayed session ended, and logs it.
    fn log_outcome(&self, session: &Session, outcome: Outcome) {
        self.sessions.totals.count(match outcome {
            Outcome::Complete => Ending::Completed,
            Outcome::Reset { .. } => Ending::Reset,
            Outcome::Failed(_) => Ending::Failed,
            Outcome::Idle => Ending::Idle,
            Outcome::Killed => Ending::Killed,
            Outcome::Shutdown => Ending::Shutdown,
        });
        log_outcome(session, outcome);
    }
}

/// How an outbound session is carried, and the peer and route it is registered under.
struct Carrier {
    peer: Option<String>,
    route: Route,
    /// The tunnel stream; `None` on the direct path.
    stream: Option<Chunked<Stream>>,
    /// The stream's flow in the shaper (the direct path opens its own once connected).
    flow: Option<FlowGuard>,
    /// The peer watches sessions to port 445 as SMB (`smb`; tunnel only).
    smb: bool,
    /// The stream carries the read-ahead engine's records: this gateway runs near.
    engine: bool,
}

impl Carrier {
    /// Directly to the destination, for `peer`'s connection (if any peer serves it).
    fn direct(peer: Option<String>) -> Self {
        Self {
            peer,
            route: Route::Bypass,
            stream: None,
            flow: None,
            smb: false,
            engine: false,
        }
    }
}

/// A peer's tunnel as routing offers it: with the codec of its streams and whether its
/// sessions to port 445 are watched.
struct Via {
    tunnel: Tunnel,
    codec: Codec,
    smb: bool,
}

/// `peer` as routing sees it now.
fn candidate(peer: &Peer, health: Duration) -> Candidate<Via> {
    let config = peer.config();
    Candidate {
        name: config.name,
        force_bypass: config.force_bypass,
        tunnel: peer.usable_tunnel(health).map(|tunnel| Via {
            tunnel,
            codec: peer.codec(),
            smb: config.smb,
        }),
        secondary: config.secondary,
        on_failure: config.on_failure,
    }
}

/// Holds what the kernel buffers from the sender on `socket` to its flow's buffer, so that
/// a shaped sender is held back by TCP flow control, not by the gateway's memory.
fn hold_to(socket: &TcpStream, flow: Option<&FlowGuard>) {
    let Some(flow) = flow else { return };
    let bytes = usize::try_from(flow.buffer()).unwrap_or(usize::MAX);
    if let Err(e) = sys::set_receive_buffer(socket, bytes) {
        debug!(error = %e, "capping the receive buffer");
    }
}

/// Marks what the gateway sends on `socket` with its class's DSCP, if it has one.
fn mark(socket: &TcpStream, class: Option<Class>) {
    if let Some(dscp) = class.and_then(|c| c.dscp)
        && let Err(e) = sys::set_dscp(socket, dscp)
    {
        debug!(error = %e, dscp, "marking the server socket");
    }
}

fn log_outcome(session: &Session, outcome: Outcome) {
    let age = session.started.elapsed();
    let up = session.from_client.load(Ordering::Relaxed);
    let down = session.from_server.load(Ordering::Relaxed);
    match outcome {
        Outcome::Complete => info!(
            bytes_from_client = up,
            bytes_from_server = down,
            ?age,
            "session closed"
        ),
        // An end's own reset is how many applications close: said plainly, as an end.
        Outcome::Reset { by } => info!(
            bytes_from_client = up,
            bytes_from_server = down,
            ?age,
            "session reset by the {by}"
        ),
        Outcome::Failed(e) => {
            warn!(error = %e, bytes_from_client = up, bytes_from_server = down, ?age, "session failed")
        }
        Outcome::Idle => info!(
            bytes_from_client = up,
            bytes_from_server = down,
            ?age,
            "session idle; reset"
        ),
        Outcome::Shutdown => info!(
            bytes_from_client = up,
            bytes_from_server = down,
            ?age,
            "session aborted at shutdown"
        ),
        Outcome::Killed => info!(
            bytes_from_client = up,
            bytes_from_server = down,
            ?age,
            "session killed by the operator"
        ),
    }
    session.set_state(SessionState::HalfClosed);
}
