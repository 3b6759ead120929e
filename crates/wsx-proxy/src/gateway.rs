//! The gateway: interception, the tunnel to each peer, sessions both ways, bypass.
//!
//! ```text
//!  LAN client ─TCP─> transparent listener ─> decide(destination's peer by prefix)
//!  any client ─TCP─> forwarding listener ──> decide(its configured peer), destination = its `to`
//!  any client ─TCP─> SOCKS5 listener ──────> decide(its configured peer), destination = asked for
//!                       ├─ peer healthy ──> tunnel stream ═══> peer: connect to destination
//!                       ├─ secondary healthy ─> its tunnel stream
//!                       ├─ policy bypass ──> direct TCP to destination (from the client's address)
//!                       └─ policy reject ──> RST
//!  peer ═══> tunnel stream ─> connect to meta.destination (from meta.source if transparent) ─TCP─> server
//! ```
//!
//! The entry points and their accept loop are [`crate::listener`]; where a connection goes
//! is [`crate::routing`].
//!
//! Tasks: one per listener, one accepting tunnels, one per peer with an endpoint (connect,
//! watch health, reconnect), one watching each accepted tunnel, one serving each tunnel's
//! incoming streams, one per session. Sessions are tracked so that shutdown can wait for them
//! up to a deadline and then abort the rest.

use crate::addrs::ClientAddr;
use crate::chunked::{Chunked, Codec};
use crate::config::{GatewayConfig, GatewayError};
use crate::listener::{
    self, Admission, Answer, EntryPoint, Forwarding, Intercepted, PeerSelector, Socks,
};
use crate::peers::{self, Peer, PeerConfig, PeerStatus, PrefixTable};
use crate::relay::{self, Outcome, Side, code};
use crate::routing::{self, Candidate, Decision};
use crate::rules::{Rules, RulesError};
use crate::session::{
    Ending, Entry, GatewayTotals, Route, Session, SessionInfo, SessionState, Sessions,
};
use crate::sys::{self, LanSocketOptions};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};
use wsx_tunnel::driver::{Driver, Stream, Tunnel};
use wsx_tunnel::{ConnectionError, EndpointConfig, PublicKey, StreamMeta, Target};

/// How long a handshake may take before the peer keeper starts over.
const HANDSHAKE_WAIT: Duration = Duration::from_secs(4);
/// How often tunnel health is checked.
const HEALTH_CHECK: Duration = Duration::from_millis(200);
/// Wait before reconnecting to a peer whose tunnel failed.
const RECONNECT_DELAY: Duration = Duration::from_secs(1);
/// The close code of a tunnel given up for silence.
const CLOSE_SILENT: u64 = 1;
/// The close code of a tunnel to a peer removed from the configuration.
const CLOSE_REMOVED: u64 = 2;

/// A running gateway. Dropping it without [`Gateway::shutdown`] leaves the rules installed;
/// call `shutdown`.
#[derive(Debug)]
pub struct Gateway {
    inner: Arc<Inner>,
}

/// What the gateway's tasks share.
#[derive(Debug)]
struct Inner {
    driver: Driver,
    local_key: PublicKey,
    config: RwLock<Arc<GatewayConfig>>,
    peers: Mutex<PeerSet>,
    sessions: Arc<Sessions>,
    slots: Arc<Semaphore>,
    rules: Mutex<Option<Rules>>,
    /// Cancelled when the gateway stops taking new work.
    stop: CancellationToken,
    /// Cancelled when the drain deadline passes: sessions abort.
    kill: CancellationToken,
    sessions_tracker: TaskTracker,
}

/// The configured peers, by key, and the prefix table built from them.
#[derive(Debug, Default)]
struct PeerSet {
    by_key: HashMap<PublicKey, PeerEntry>,
    table: Arc<PrefixTable>,
}

impl PeerSet {
    /// The peer configured under `name`.
    fn by_name(&self, name: &str) -> Option<&Arc<Peer>> {
        self.by_key
            .values()
            .map(|e| &e.peer)
            .find(|p| p.config().name == name)
    }
}

#[derive(Debug)]
struct PeerEntry {
    peer: Arc<Peer>,
    /// Stops the peer's keeper and watchers.
    cancel: CancellationToken,
}

impl Gateway {
    /// Binds the tunnel socket and the listeners, installs the rules and starts serving.
    pub async fn start(config: GatewayConfig) -> Result<Self, GatewayError> {
        config.validate_peers()?;
        let driver = bind_tunnel(&config)?;
        info!(address = %driver.local_addr(), public_key = %driver.public_key(), "tunnel listening");
        let transparent = match &config.intercept {
            Some(intercept) => listener::bind_transparent(intercept.port)?,
            None => Vec::new(),
        };
        let mut forwards = Vec::new();
        for forward in &config.forwards {
            let listener = listener::bind(forward.listen).await?;
            info!(name = %forward.name, address = %forward.listen, to = %forward.to, peer = %forward.peer, "forwarding listener");
            forwards.push((listener, forward.clone()));
        }
        let mut socks = Vec::new();
        for s in &config.socks {
            let listener = listener::bind(s.listen).await?;
            info!(name = %s.name, address = %s.listen, peer = %s.peer, authentication = !s.users.is_empty(), "SOCKS5 listener");
            socks.push((listener, s.clone()));
        }
        let inner = Arc::new(Inner {
            local_key: driver.public_key(),
            driver,
            slots: Arc::new(Semaphore::new(config.sessions.max_sessions)),
            config: RwLock::new(Arc::new(config.clone())),
            peers: Mutex::new(PeerSet::default()),
            sessions: Arc::new(Sessions::default()),
            rules: Mutex::new(None),
            stop: CancellationToken::new(),
            kill: CancellationToken::new(),
            sessions_tracker: TaskTracker::new(),
        });
        inner.apply_peers(&config.peers);
        inner.install_rules(&config).await?;
        for listener in transparent {
            inner.spawn_accept(listener, Intercepted);
        }
        for (listener, forward) in forwards {
            inner.spawn_accept(listener, Forwarding(forward));
        }
        for (listener, s) in socks {
            inner.spawn_accept(listener, Socks(s));
        }
        tokio::spawn(inner.clone().accept_tunnels());
        Ok(Self { inner })
    }

    /// Applies a new configuration: peers, prefixes (the rules follow) and session limits.
    /// Established sessions are kept. The key, the tunnel address, the transport settings
    /// (`max_datagram`, `max_rate`), the listeners and interception on/off need a restart.
    pub async fn reload(&self, config: GatewayConfig) -> Result<(), GatewayError> {
        config.validate_peers()?;
        let old = self.inner.config();
        if let Some(what) = old.needs_restart(&config) {
            return Err(GatewayError::NeedsRestart(what));
        }
        *self
            .inner
            .config
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(config.clone());
        self.inner
            .resize_slots(old.sessions.max_sessions, config.sessions.max_sessions);
        self.inner
            .driver
            .set_peers(config.peers.iter().map(|p| p.public_key).collect());
        self.inner.apply_peers(&config.peers);
        self.inner.update_rules(&config).await?;
        info!(peers = config.peers.len(), "configuration reloaded");
        Ok(())
    }

    pub fn sessions(&self) -> Vec<SessionInfo> {
        self.inner.sessions.snapshot(Instant::now())
    }

    /// One live session.
    pub fn session(&self, id: u64) -> Option<SessionInfo> {
        self.inner.sessions.get(id, Instant::now())
    }

    /// Ends a live session now: the client and the server (or the peer's stream) are reset.
    /// Returns false if there is no such session.
    pub fn kill_session(&self, id: u64) -> bool {
        self.inner.sessions.kill(id)
    }

    /// What the gateway did since it started.
    pub fn totals(&self) -> GatewayTotals {
        self.inner.sessions.totals.snapshot(Instant::now())
    }

    /// Forces new sessions toward a peer's prefixes to go direct (`true`) or lets them use
    /// the tunnel again (`false`), until the next reload sets the configured value. Returns
    /// false if no peer has that name.
    pub fn set_bypass(&self, name: &str, force: bool) -> bool {
        let set = self.inner.peer_set();
        let Some(peer) = set.by_name(name) else {
            return false;
        };
        let mut config = peer.config();
        config.force_bypass = force;
        peer.set_config(config);
        true
    }

    pub fn peers(&self) -> Vec<PeerStatus> {
        let health = self.inner.config().sessions.health_timeout;
        let mut list: Vec<PeerStatus> = self
            .inner
            .peer_set()
            .by_key
            .values()
            .map(|e| peers::status(&e.peer, health))
            .collect();
        list.sort_by(|a, b| a.name.cmp(&b.name));
        list
    }

    pub fn public_key(&self) -> PublicKey {
        self.inner.local_key
    }

    pub fn tunnel_addr(&self) -> SocketAddr {
        self.inner.driver.local_addr()
    }

    /// Stops taking new connections (the rules stop intercepting them, so they flow past
    /// unaccelerated), lets sessions finish for up to `deadline`, aborts the rest, removes
    /// the rules and closes the tunnels.
    pub async fn shutdown(self, deadline: Duration) {
        let inner = self.inner;
        inner.stop.cancel();
        let rules = inner.lock_rules().take();
        let rules = match rules {
            Some(rules) => tokio::task::spawn_blocking(move || {
                if let Err(e) = rules.drain() {
                    warn!(error = %e, "could not stop intercepting; removing the rules now");
                }
                rules
            })
            .await
            .ok(),
            None => None,
        };
        inner.drain_sessions(deadline).await;
        if let Some(rules) = rules {
            let _ = tokio::task::spawn_blocking(move || rules.remove()).await;
            info!("interception rules removed");
        }
        inner.stop_peers();
        // The cancelled tasks let go of the gateway within a few polls; then the driver can
        // close the tunnels and wait for the CLOSE frames to leave.
        let mut inner = inner;
        for _ in 0..100 {
            match Arc::try_unwrap(inner) {
                Ok(inner) => return inner.driver.shutdown().await,
                Err(shared) => inner = shared,
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        warn!("tasks still running at shutdown; closing the tunnels without waiting");
    }
}

/// The tunnel's driver on its UDP socket. Both ends PING at a quarter of the health timeout
/// when idle, so that a silent tunnel means a dead peer.
fn bind_tunnel(config: &GatewayConfig) -> Result<Driver, GatewayError> {
    let mut transport = config.transport.clone();
    transport.keepalive = transport.keepalive.min(config.sessions.health_timeout / 4);
    let mut endpoint = EndpointConfig::new(
        config.secret.clone(),
        config.peers.iter().map(|p| p.public_key).collect(),
        fastrand::u64(..),
    );
    endpoint.transport = transport;
    Driver::bind(config.tunnel_listen, endpoint).map_err(|source| GatewayError::TunnelSocket {
        addr: config.tunnel_listen,
        source,
    })
}

impl Inner {
    fn config(&self) -> Arc<GatewayConfig> {
        self.config
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn peer_set(&self) -> MutexGuard<'_, PeerSet> {
        self.peers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_rules(&self) -> MutexGuard<'_, Option<Rules>> {
        self.rules.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `listener`'s accept loop: each connection `entry_point` admits becomes an
    /// outbound session.
    fn spawn_accept<E: EntryPoint>(self: &Arc<Self>, listener: TcpListener, entry_point: E) {
        let inner = self.clone();
        tokio::spawn(listener::accept(
            listener,
            Arc::new(entry_point),
            self.stop.clone(),
            self.sessions_tracker.clone(),
            move |entry_point, tcp, client, admission| {
                inner.clone().outbound(entry_point, tcp, client, admission)
            },
        ));
    }

    /// Installs the rules `config` needs, if any, for the peers' prefixes.
    async fn install_rules(&self, config: &GatewayConfig) -> Result<(), GatewayError> {
        let table = self.peer_set().table.clone();
        let Some(rules) = config.rules(&table) else {
            return Ok(());
        };
        let installed = tokio::task::spawn_blocking(move || Rules::install(rules))
            .await
            .map_err(|e| {
                GatewayError::Rules(RulesError::Failed {
                    command: "install".into(),
                    stderr: e.to_string(),
                })
            })??;
        info!(table = crate::rules::TABLE, "interception rules installed");
        *self.lock_rules() = Some(installed);
        Ok(())
    }

    /// Rewrites the installed rules for `config` and the peers' prefixes.
    async fn update_rules(self: &Arc<Self>, config: &GatewayConfig) -> Result<(), GatewayError> {
        let table = self.peer_set().table.clone();
        let Some(rules) = config.rules(&table) else {
            return Ok(());
        };
        let inner = self.clone();
        tokio::task::spawn_blocking(move || match inner.lock_rules().as_mut() {
            Some(installed) => installed.update(rules),
            None => Ok(()),
        })
        .await
        .map_err(|e| {
            GatewayError::Rules(RulesError::Failed {
                command: "update".into(),
                stderr: e.to_string(),
            })
        })??;
        Ok(())
    }

    /// Changes the number of session slots from `old` to `new`. Slots held by live sessions
    /// come back later and are then forgotten.
    fn resize_slots(&self, old: usize, new: usize) {
        if new > old {
            self.slots.add_permits(new - old);
        } else if new < old {
            let slots = self.slots.clone();
            let mut missing = old - new;
            missing -= slots.forget_permits(missing);
            if missing > 0 {
                tokio::spawn(async move {
                    if let Ok(permits) = slots.acquire_many(missing as u32).await {
                        permits.forget();
                    }
                });
            }
        }
    }

    /// Waits for the sessions to end, up to `deadline`; then aborts the rest.
    async fn drain_sessions(&self, deadline: Duration) {
        self.sessions_tracker.close();
        let live = self.sessions.len();
        if live > 0 {
            info!(sessions = live, deadline = ?deadline, "draining sessions");
        }
        if tokio::time::timeout(deadline, self.sessions_tracker.wait())
            .await
            .is_err()
        {
            warn!(
                sessions = self.sessions.len(),
                "drain deadline passed; aborting the rest"
            );
            self.kill.cancel();
            self.sessions_tracker.wait().await;
        }
    }
}

impl Inner {
    /// Brings the peer set in line with `configs`: new peers start, removed ones stop and
    /// their tunnels close, changed ones keep their tunnels unless the endpoint changed.
    fn apply_peers(self: &Arc<Self>, configs: &[PeerConfig]) {
        let mut set = self.peer_set();
        let mut keep = HashMap::new();
        for config in configs {
            let existing = set.by_key.remove(&config.public_key);
            let entry = match existing {
                Some(entry) if entry.peer.config().endpoint == config.endpoint => {
                    entry.peer.set_config(config.clone());
                    entry
                }
                previous => {
                    if let Some(previous) = previous {
                        retire(previous);
                    }
                    let entry = PeerEntry {
                        peer: Arc::new(Peer::new(config.clone())),
                        cancel: self.stop.child_token(),
                    };
                    if let Some(endpoint) = config.endpoint {
                        let keeper = self.clone().keep_peer(
                            entry.peer.clone(),
                            endpoint,
                            entry.cancel.clone(),
                        );
                        tokio::spawn(keeper.instrument(info_span!("peer", name = %config.name)));
                    }
                    entry
                }
            };
            keep.insert(config.public_key, entry);
        }
        for (_, removed) in set.by_key.drain() {
            retire(removed);
        }
        let peers: Vec<Arc<Peer>> = keep.values().map(|e| e.peer.clone()).collect();
        set.table = Arc::new(PrefixTable::new(&peers));
        set.by_key = keep;

        fn retire(entry: PeerEntry) {
            entry.cancel.cancel();
            for tunnel in entry.peer.tunnels() {
                tunnel.close(CLOSE_REMOVED, b"peer removed");
            }
        }
    }

    /// Keeps a tunnel to a peer up: connects whenever there is no healthy one (the peer may
    /// have connected to us instead), watches it, reconnects.
    async fn keep_peer(
        self: Arc<Self>,
        peer: Arc<Peer>,
        endpoint: SocketAddr,
        cancel: CancellationToken,
    ) {
        let key = peer.config().public_key;
        let mut failures = 0u32;
        while !cancel.is_cancelled() {
            let health = self.config().sessions.health_timeout;
            if peer.usable_tunnel(health).is_some() {
                sleep_or_cancel(HEALTH_CHECK, &cancel).await;
                continue;
            }
            let tunnel = match self.driver.connect(endpoint, key) {
                Ok(t) => t,
                Err(e) => {
                    warn!(error = %e, %endpoint, "cannot connect");
                    sleep_or_cancel(RECONNECT_DELAY, &cancel).await;
                    continue;
                }
            };
            let handshake = tokio::select! {
                r = tokio::time::timeout(HANDSHAKE_WAIT, tunnel.established()) => r,
                () = cancel.cancelled() => break,
            };
            match handshake {
                Ok(Ok(())) => {
                    failures = 0;
                    self.adopt(&peer, tunnel.clone(), &cancel);
                    self.watch(&peer, &tunnel, &cancel).await;
                }
                // The peer connected at the same moment and its attempt won: use that one.
                Ok(Err(ConnectionError::Replaced)) => debug!("our handshake lost to the peer's"),
                Ok(Err(e)) => {
                    failures += 1;
                    log_failure(failures, &format!("handshake failed: {e}"), endpoint);
                    sleep_or_cancel(RECONNECT_DELAY, &cancel).await;
                }
                Err(_) => {
                    tunnel.close(CLOSE_SILENT, b"handshake timed out");
                    // The peer ignores our attempt when its own, made at the same moment,
                    // wins; then its tunnel is in service by now.
                    if peer.usable_tunnel(health).is_some() {
                        debug!("no answer to the handshake; the peer's own tunnel is up");
                    } else {
                        failures += 1;
                        // The initiation is as long as a data packet: a path with a smaller
                        // MTU drops it, which looks like this.
                        log_failure(
                            failures,
                            "no answer to the handshake (is the peer running, does it know our \
                             key, and does the path carry datagrams of the tunnel's \
                             max_datagram?)",
                            endpoint,
                        );
                    }
                }
            }
        }
    }

    /// Takes a tunnel into service: it carries new streams and its incoming streams are
    /// served.
    fn adopt(self: &Arc<Self>, peer: &Arc<Peer>, tunnel: Tunnel, cancel: &CancellationToken) {
        peer.add_tunnel(tunnel.clone());
        info!(remote = %tunnel.remote_address(), rtt = ?tunnel.rtt(), "tunnel in service");
        let name = peer.config().name;
        let serve = self
            .clone()
            .serve_tunnel(peer.clone(), tunnel, cancel.clone());
        tokio::spawn(serve.instrument(info_span!("peer", %name)));
    }

    /// Returns when the tunnel has ended or gone silent (then it is closed), and takes it
    /// out of service.
    async fn watch(&self, peer: &Peer, tunnel: &Tunnel, cancel: &CancellationToken) {
        let mut interval = tokio::time::interval(HEALTH_CHECK);
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                () = cancel.cancelled() => break,
            }
            if let Some(e) = tunnel.error() {
                warn!(error = %e, "tunnel closed");
                break;
            }
            let silent = tunnel.silent_for();
            let limit = self.config().sessions.health_timeout;
            if silent >= limit {
                warn!(silent = ?silent, "peer not heard from; tunnel down");
                tunnel.close(CLOSE_SILENT, b"peer silent");
                break;
            }
        }
        peer.remove_tunnel(tunnel);
        log_tunnel_totals(tunnel);
    }

    async fn accept_tunnels(self: Arc<Self>) {
        loop {
            let tunnel = tokio::select! {
                t = self.driver.accept() => match t { Some(t) => t, None => return },
                () = self.stop.cancelled() => return,
            };
            let entry = self
                .peer_set()
                .by_key
                .get(&tunnel.peer())
                .map(|e| (e.peer.clone(), e.cancel.clone()));
            let Some((peer, cancel)) = entry else {
                tunnel.close(CLOSE_REMOVED, b"not a peer");
                continue;
            };
            let name = peer.config().name;
            let this = self.clone();
            tokio::spawn(
                async move {
                    match tokio::time::timeout(HANDSHAKE_WAIT, tunnel.established()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => return debug!(error = %e, "accepted tunnel ended"),
                        Err(_) => return debug!("accepted tunnel never confirmed"),
                    }
                    this.adopt(&peer, tunnel.clone(), &cancel);
                    this.watch(&peer, &tunnel, &cancel).await;
                }
                .instrument(info_span!("peer", %name)),
            );
        }
    }

    /// Serves the streams the peer opens on `tunnel`.
    async fn serve_tunnel(
        self: Arc<Self>,
        peer: Arc<Peer>,
        tunnel: Tunnel,
        cancel: CancellationToken,
    ) {
        loop {
            let stream = tokio::select! {
                s = tunnel.accept_stream() => match s { Ok(s) => s, Err(_) => return },
                () = cancel.cancelled() => return,
            };
            let this = self.clone();
            let peer = peer.clone();
            self.sessions_tracker
                .spawn(async move { this.inbound(peer, stream).await });
        }
    }

    /// Stops every peer's keeper and watchers (their tunnels leave service and log their
    /// totals), logging what compression did for each peer.
    fn stop_peers(&self) {
        for entry in self.peer_set().by_key.values() {
            log_compression_totals(&entry.peer);
            entry.cancel.cancel();
        }
    }
}

/// What a tunnel carried in its life, logged for operators when it leaves service:
/// packets, losses and FEC (the API shows the same counters while it is in service).
fn log_tunnel_totals(tunnel: &Tunnel) {
    let t = tunnel.stats();
    info!(
        packets_sent = t.eliciting_sent,
        bytes_sent = t.bytes_sent,
        packets_lost = t.packets_lost,
        fec_parity_sent = t.fec.parity_sent,
        fec_parity_bytes = t.fec.parity_bytes_sent,
        fec_recovered_by_peer = t.fec.recovered_by_peer,
        fec_recovered = t.fec.recovered,
        fec_unrecoverable_groups = t.fec.unrecoverable_groups,
        "tunnel totals"
    );
}

/// What compression did for a peer's sessions since the start, logged at shutdown.
fn log_compression_totals(peer: &Peer) {
    let c = peer.compression();
    info!(
        peer = %peer.config().name,
        plain_sent = c.plain_sent,
        wire_sent = c.wire_sent,
        chunks_deflated = c.chunks_deflated,
        chunks_incompressible = c.chunks_incompressible,
        chunks_stored = c.chunks_stored,
        compress_ms = c.compress_time.as_millis() as u64,
        wire_received = c.wire_received,
        plain_received = c.plain_received,
        inflate_ms = c.inflate_time.as_millis() as u64,
        "compression totals"
    );
}

/// Logs the first failures to reach a peer, then only every tenth, so a peer that is down for
/// hours does not flood the journal.
fn log_failure(failures: u32, what: &str, endpoint: SocketAddr) {
    if failures <= 3 || failures % 10 == 0 {
        warn!(%endpoint, failures, "{what}");
    }
}

async fn sleep_or_cancel(duration: Duration, cancel: &CancellationToken) {
    tokio::select! {
        () = tokio::time::sleep(duration) => {}
        () = cancel.cancelled() => {}
    }
}

impl Inner {
    /// An admitted connection: routed, registered, and relayed through the tunnel or
    /// directly; `entry_point` answers the client.
    async fn outbound<E: EntryPoint>(
        self: Arc<Self>,
        entry_point: Arc<E>,
        mut tcp: TcpStream,
        client: ClientAddr,
        admission: Admission,
    ) {
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
        let (peer, route, stream) = match self.decide(&selector, permit.is_some()) {
            Decision::Reject { peer } => {
                info!(%client, %destination, %peer, "peer down; connection rejected");
                self.sessions.totals.count(Ending::RefusedPeerDown);
                let _ = entry_point.answer(&mut tcp, Answer::Rejected).await;
                sys::abort(tcp);
                return;
            }
            Decision::Tunnel {
                peer,
                tunnel: (tunnel, codec),
            } => {
                let meta = StreamMeta {
                    source: Some(client.0),
                    destination: Some(destination.clone()),
                    transparent,
                    ..StreamMeta::default()
                };
                match tunnel.open(meta) {
                    Ok(stream) => (Some(peer), Route::Tunnel, Some(Chunked::new(stream, codec))),
                    Err(e) => {
                        debug!(error = %e, %peer, "no stream; bypassing");
                        (Some(peer), Route::Bypass, None)
                    }
                }
            }
            Decision::Bypass { peer, reason } => {
                debug!(%client, %destination, reason = reason.as_str(), "bypass");
                (peer, Route::Bypass, None)
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
                    self.relay(&session, tcp, stream).await
                }
                // Direct, and for an intercepted client still from its address: the server
                // sees the same connection it would without wsx.
                None => {
                    let from = transparent.then_some(client.0.ip());
                    let to = (from, &destination);
                    match self.direct(&*entry_point, &session, tcp, to, &config).await {
                        Some(outcome) => outcome,
                        None => return,
                    }
                }
            };
            self.log_outcome(&session, outcome);
        }
        .instrument(span)
        .await;
        drop(permit);
    }

    /// Where a connection for the peer `selector` finds goes, given whether a session slot
    /// is free: the peer's tunnel, its secondary's, or its failure policy.
    fn decide(&self, selector: &PeerSelector, slot_free: bool) -> Decision<(Tunnel, Codec)> {
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
        (from, destination): (Option<IpAddr>, &Target),
        config: &GatewayConfig,
    ) -> Option<Outcome> {
        match sys::connect_target(from, destination, config.sessions.connect_timeout).await {
            Ok(server) => {
                let options = LanSocketOptions {
                    keepalive: config.sessions.tcp_keepalive,
                };
                let _ = sys::tune(&server, &options);
                let answer = Answer::Connected {
                    direct: Some(&server),
                };
                entry_point.answer(&mut tcp, answer).await.ok()?;
                Some(self.relay(session, tcp, server).await)
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
    async fn inbound(self: Arc<Self>, peer: Arc<Peer>, mut stream: Stream) {
        let (codec, peer) = (peer.codec(), peer.config().name);
        let meta = stream.meta().clone();
        let (Some(source), Some(destination)) = (meta.source, meta.destination.clone()) else {
            stream.reset(code::REJECTED);
            return;
        };
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
            let from = (config.transparent_origin && meta.transparent).then_some(client.0.ip());
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
                    info!("session opened");
                    let stream = Chunked::new(stream, codec);
                    let outcome = self.relay(&session, stream, server).await;
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
        drop(permit);
    }

    /// Relays a session's two sides until they end, it idles out, the operator kills it or
    /// the drain deadline passes.
    async fn relay(&self, session: &Session, client: impl Side, server: impl Side) -> Outcome {
        let config = self.config();
        relay::relay(
            client,
            server,
            session,
            config.sessions.relay_buffer,
            config.sessions.idle_timeout,
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
            Outcome::Failed(_) => Ending::Failed,
            Outcome::Idle => Ending::Idle,
            Outcome::Killed => Ending::Killed,
            Outcome::Shutdown => Ending::Shutdown,
        });
        log_outcome(session, outcome);
    }
}

/// `peer` as routing sees it now.
fn candidate(peer: &Peer, health: Duration) -> Candidate<(Tunnel, Codec)> {
    let config = peer.config();
    Candidate {
        name: config.name,
        force_bypass: config.force_bypass,
        tunnel: peer.usable_tunnel(health).map(|t| (t, peer.codec())),
        secondary: config.secondary,
        on_failure: config.on_failure,
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
        Outcome::Failed(e) => {
            info!(error = %e, bytes_from_client = up, bytes_from_server = down, ?age, "session reset")
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
