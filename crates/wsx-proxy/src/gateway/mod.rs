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
//! This module holds the gateway's life: start, reload, shutdown, and what the API reads.
//! The rest lives in rooms of its own:
//!
//! - [`crate::listener`]: the entry points and the one accept loop they share;
//! - [`crate::routing`]: where a new connection goes (pure);
//! - `sessions`: outbound sessions (an admitted connection, routed and relayed) and inbound
//!   ones (a stream the peer opened, connected to its destination);
//! - `keeper`: the peer set, one keeper per peer with an endpoint (connect, watch health,
//!   reconnect), the tunnels peers open, and the streams each tunnel carries in.
//!
//! Tasks: one per listener, one accepting tunnels, one per peer with an endpoint, one
//! watching each accepted tunnel, one serving each tunnel's incoming streams, one per
//! session. Sessions are tracked so that shutdown can wait for them up to a deadline and
//! then abort the rest.

mod capacity;
mod keeper;
mod sessions;

use crate::config::{GatewayConfig, GatewayError};
use crate::listener::{self, EntryPoint, Forwarding, Intercepted, Socks};
use crate::peers::{self, Peer, PeerStatus, PrefixTable};
use crate::rules::{Rules, RulesError};
use crate::session::{GatewayTotals, SessionInfo, Sessions};
use crate::shaping::{ShaperStatus, Shaping, ShapingConfig, ShapingError};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};
use wsx_shaper::Rate;
use wsx_tunnel::driver::{Driver, Tunnel};
use wsx_tunnel::{EndpointConfig, PublicKey};

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
    /// The bandwidth controller: made when a configuration first has one, kept from then
    /// on (its flows live as long as their sessions).
    shaper: Mutex<Option<Arc<Shaping>>>,
    /// Whether the configuration has a shaper: new sessions are classified and new
    /// tunnels served by it. Turned off, it goes on serving the flows it has, unlimited.
    shaping_on: AtomicBool,
    /// The hint about `transparent_origin` was logged (once per run).
    origin_hinted: AtomicBool,
    /// Sessions held against the open-file limit and the memory budget.
    capacity: capacity::Capacity,
    /// Large relay buffers, lent within the memory budget.
    relay_buffers: Arc<crate::buffers::RelayBuffers>,
    /// What the SMB observers concluded.
    smb: Arc<crate::smb::SmbTotals>,
}

/// The memory budget's state ([`Gateway::memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStatus {
    /// The configured `memory_budget`, bytes.
    pub budget: u64,
    /// The part of it large relay buffers are lent from, and what is lent now.
    pub relay_buffers_budget: u64,
    pub relay_buffers_lent: u64,
    /// Times a session went on with its small buffer because the budget was spent.
    pub relay_buffers_refused: u64,
}

/// How often [`Inner::watch_capacity`] looks, and where it pauses and resumes interception
/// (fractions of the fuller of the descriptors and the memory budget's sessions).
const CAPACITY_CHECK: Duration = Duration::from_millis(200);
const PAUSE_AT: f64 = 0.9;
const RESUME_BELOW: f64 = 0.75;

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
        let budget = crate::MemoryBudget {
            total: config.sessions.memory_budget,
        };
        let capacity = capacity::Capacity::new(budget.sessions());
        let driver = bind_tunnel(&config, budget, capacity.sessions())?;
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
        // A descriptor kept for refusing connections when none is left (listener.rs).
        listener::keep_reserve();
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
            shaper: Mutex::new(None),
            shaping_on: AtomicBool::new(false),
            origin_hinted: AtomicBool::new(false),
            capacity,
            relay_buffers: crate::buffers::RelayBuffers::new(
                usize::try_from(budget.relay_buffers()).unwrap_or(usize::MAX),
            ),
            smb: Arc::default(),
        });
        if let Some(c) = &config.shaping {
            inner.shaping_on_with(c)?;
        }
        inner.apply_peers(&config.peers);
        inner.install_rules(&config).await?;
        if config.intercept.is_some() {
            tokio::spawn(inner.clone().watch_capacity());
        }
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

    /// How many sessions through the tunnel this gateway's open-file limit and memory
    /// budget carry (as they were at start; a session relayed directly holds two
    /// descriptors): beyond it, new sessions are refused at once.
    pub fn session_capacity(&self) -> usize {
        self.inner.capacity.sessions()
    }

    /// The memory budget and what its relay buffers lend now.
    pub fn memory(&self) -> MemoryStatus {
        let buffers = &self.inner.relay_buffers;
        MemoryStatus {
            budget: self.inner.config().sessions.memory_budget,
            relay_buffers_budget: buffers.budget() as u64,
            relay_buffers_lent: buffers.lent() as u64,
            relay_buffers_refused: buffers.refused(),
        }
    }

    /// What the SMB observers of the sessions to port 445 concluded, since start.
    pub fn smb(&self) -> crate::SmbStats {
        self.inner.smb.snapshot()
    }

    /// The configured `max_sessions`.
    pub fn max_sessions(&self) -> usize {
        self.inner.config().sessions.max_sessions
    }

    /// Applies a new configuration: peers, prefixes (the rules follow), session limits, the
    /// shaper on or off, scenarios and filters. Established sessions are kept (their flows
    /// move to the scenario of the same name, or `default`; with the shaper turned off they
    /// go on unlimited, and sessions opened while it was off stay unshaped). The key, the
    /// tunnel address, the transport settings (`max_datagram`, `max_rate`), the listeners
    /// and interception on/off need a restart.
    pub async fn reload(&self, config: GatewayConfig) -> Result<(), GatewayError> {
        config.validate_peers()?;
        let old = self.inner.config();
        if let Some(what) = old.needs_restart(&config) {
            return Err(GatewayError::NeedsRestart(what));
        }
        match &config.shaping {
            Some(new) if old.shaping.as_ref() != Some(new) => {
                self.inner.shaping_on_with(new)?;
                info!(
                    scenarios = new.scenarios.len(),
                    filters = new.filters.len(),
                    "shaper reconfigured"
                );
            }
            None if old.shaping.is_some() => {
                self.inner.shaping_off()?;
                info!("shaper off: sessions it shaped go on unlimited, new ones are not shaped");
            }
            _ => {}
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

    /// The bandwidth controller's scenarios and counters, if the gateway shapes. Each
    /// reading's rates cover the time since the previous reading at least a second old.
    pub fn shaper(&self) -> Option<ShaperStatus> {
        Some(self.inner.shaping()?.status(Instant::now()))
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
    /// the rules and closes the tunnels, once what the sessions sent last has reached the
    /// peer or the deadline has passed.
    pub async fn shutdown(self, deadline: Duration) {
        let drain_until = Instant::now() + deadline;
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
        // deliver what the ended sessions wrote last (within what is left of the deadline),
        // close the tunnels and wait for the CLOSE frames to leave.
        let mut inner = inner;
        for _ in 0..100 {
            match Arc::try_unwrap(inner) {
                Ok(inner) => {
                    let flush = drain_until.saturating_duration_since(Instant::now());
                    return inner.driver.shutdown(flush).await;
                }
                Err(shared) => inner = shared,
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        warn!("tasks still running at shutdown; closing the tunnels without waiting");
    }
}

/// The tunnel's driver on its UDP socket. Both ends PING at a quarter of the health timeout
/// when idle, so that a silent tunnel means a dead peer. Each tunnel's buffers stay within
/// its part of the memory budget, and its peers may open as many concurrent streams as this
/// gateway carries sessions.
fn bind_tunnel(
    config: &GatewayConfig,
    budget: crate::MemoryBudget,
    sessions: usize,
) -> Result<Driver, GatewayError> {
    let mut transport = config.transport.clone();
    transport.max_concurrent_streams = transport
        .max_concurrent_streams
        .max(u64::try_from(sessions).unwrap_or(u64::MAX));
    transport.keepalive = transport.keepalive.min(config.sessions.health_timeout / 4);
    let per_tunnel = budget.per_tunnel(config.peers.len());
    transport.connection_send_buffer = transport.connection_send_buffer.min(per_tunnel);
    transport.connection_window = transport.connection_window.min(per_tunnel);
    transport.stream_send_buffer = transport
        .stream_send_buffer
        .min(transport.connection_send_buffer);
    transport.stream_window = transport.stream_window.min(transport.connection_window);
    // Every gateway runs the SMB engine on a stream its peer marks for it.
    transport.app_extensions |= crate::smb::EXTENSION;
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

    /// The shaper, if the configuration has one.
    fn shaping(&self) -> Option<Arc<Shaping>> {
        if !self.shaping_on.load(Ordering::Acquire) {
            return None;
        }
        self.shaper
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Turns the shaper on with `config`, or reconfigures it: made and pumped the first
    /// time, then given every tunnel in service (a tunnel adopted meanwhile either is among
    /// them or finds the shaper on).
    fn shaping_on_with(&self, config: &ShapingConfig) -> Result<(), ShapingError> {
        let shaping = {
            let mut shaper = self.shaper.lock().unwrap_or_else(PoisonError::into_inner);
            match &*shaper {
                Some(shaping) => {
                    shaping.reconfigure(config, Instant::now())?;
                    shaping.clone()
                }
                None => {
                    let shaping = Shaping::new(config, Instant::now())?;
                    tokio::spawn(shaping.clone().pump(self.stop.clone()));
                    *shaper = Some(shaping.clone());
                    shaping
                }
            }
        };
        self.shaping_on.store(true, Ordering::Release);
        let tunnels: Vec<Tunnel> = self
            .peer_set()
            .by_key
            .values()
            .flat_map(|e| e.peer.tunnels())
            .collect();
        for tunnel in &tunnels {
            shaping.add_tunnel(tunnel);
        }
        Ok(())
    }

    /// Turns the shaper off: new sessions are not classified, the tunnels get their own
    /// schedulers back, and the flows it has (direct relays) go on under a tree that
    /// limits nothing until their sessions end.
    fn shaping_off(&self) -> Result<(), ShapingError> {
        self.shaping_on.store(false, Ordering::Release);
        let shaper = self
            .shaper
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(shaping) = shaper {
            shaping.release_tunnels();
            shaping.reconfigure(&ShapingConfig::new(Rate::MAX), Instant::now())?;
        }
        Ok(())
    }

    fn peer_set(&self) -> MutexGuard<'_, PeerSet> {
        self.peers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// While sessions fill the descriptors' capacity, new connections are not
    /// intercepted: they take the kernel's own route, unaccelerated (fail open). Checked
    /// every [`CAPACITY_CHECK`]; paused at [`PAUSE_AT`] of the capacity, resumed below
    /// [`RESUME_BELOW`], so that it does not flap.
    async fn watch_capacity(self: Arc<Self>) {
        let mut tick = tokio::time::interval(CAPACITY_CHECK);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = self.stop.cancelled() => return,
            }
            let load = self.capacity.load();
            let (holding, capacity) = (self.capacity.holding(), self.capacity.sessions());
            let paused = self.lock_rules().as_ref().is_some_and(Rules::is_paused);
            let pause = if !paused && load >= PAUSE_AT {
                true
            } else if paused && load < RESUME_BELOW {
                false
            } else {
                continue;
            };
            let inner = self.clone();
            let result = tokio::task::spawn_blocking(move || match inner.lock_rules().as_mut() {
                Some(rules) => rules.pause(pause),
                None => Ok(()),
            })
            .await;
            match result {
                Ok(Ok(())) if pause => warn!(
                    sessions = holding,
                    capacity,
                    "at capacity: new connections are not intercepted (they go direct, \
                     unaccelerated) until sessions end"
                ),
                Ok(Ok(())) => info!(sessions = holding, "below capacity: intercepting again"),
                Ok(Err(e)) => warn!(error = %e, "could not change the interception rules"),
                Err(e) => warn!(error = %e, "could not change the interception rules"),
            }
        }
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
