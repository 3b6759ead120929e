//! The session table: every relayed connection, with its addresses, route and byte counts,
//! and the gateway's running totals ([`GatewayTotals`]).

use crate::addrs::ClientAddr;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use wsx_tunnel::Target;

/// How a session is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum Route {
    /// Intercepted here and carried through the tunnel to a peer.
    Tunnel,
    /// Arrived through the tunnel; this gateway re-originated it to the server.
    Inbound,
    /// Intercepted here and connected directly to the server, because the peer was down,
    /// bypass was forced, or no tunnel stream was available.
    Bypass,
    /// Relayed directly to the server because its scenario's mode says so (`aggregate`,
    /// `fixed`), shaped here.
    Direct,
}

impl Route {
    /// Every route, in the order of their counters.
    pub const ALL: [Route; 4] = [Route::Tunnel, Route::Inbound, Route::Bypass, Route::Direct];
}

impl Route {
    pub fn as_str(self) -> &'static str {
        match self {
            Route::Tunnel => "tunnel",
            Route::Inbound => "inbound",
            Route::Bypass => "bypass",
            Route::Direct => "direct",
        }
    }
}

/// Where a session entered this gateway.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Entry {
    /// Intercepted on its way through (TPROXY).
    Intercepted,
    /// Accepted by the named forwarding listener.
    Forward(String),
    /// Accepted by the named SOCKS5 listener.
    Socks(String),
    /// Opened by the peer through the tunnel.
    Tunnel,
}

impl Entry {
    /// `intercepted`, `forward`, `socks` or `tunnel`.
    pub fn kind(&self) -> &'static str {
        match self {
            Entry::Intercepted => "intercepted",
            Entry::Forward(_) => "forward",
            Entry::Socks(_) => "socks",
            Entry::Tunnel => "tunnel",
        }
    }

    /// The listener's name, for the entry points that have one.
    pub fn listener(&self) -> Option<&str> {
        match self {
            Entry::Forward(name) | Entry::Socks(name) => Some(name),
            Entry::Intercepted | Entry::Tunnel => None,
        }
    }
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.listener() {
            Some(name) => write!(f, "{}:{name}", self.kind()),
            None => f.write_str(self.kind()),
        }
    }
}

/// Where a session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum SessionState {
    /// Connecting to the server (far side or bypass).
    Connecting = 0,
    /// Relaying both ways.
    Open = 1,
    /// One direction has ended.
    HalfClosed = 2,
}

impl SessionState {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Connecting,
            1 => Self::Open,
            _ => Self::HalfClosed,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SessionState::Connecting => "connecting",
            SessionState::Open => "open",
            SessionState::HalfClosed => "half-closed",
        }
    }
}

/// One session's live record, shared by its relay (which counts) and the table (which reads).
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) id: u64,
    pub(crate) client: ClientAddr,
    pub(crate) destination: Target,
    pub(crate) entry: Entry,
    pub(crate) peer: Option<String>,
    pub(crate) route: Route,
    pub(crate) started: Instant,
    /// Bytes read from the client side and from the server side.
    pub(crate) from_client: AtomicU64,
    pub(crate) from_server: AtomicU64,
    /// Milliseconds after `started` of the last byte either way.
    pub(crate) last_activity_ms: AtomicU64,
    state: AtomicU8,
    /// The gateway's byte counters for the session's peer and route.
    pub(crate) traffic: Arc<Traffic>,
    /// Cancelled to end the session now: by the operator, or by the gateway's drain deadline
    /// (a child of its token).
    pub(crate) kill: CancellationToken,
}

impl Session {
    pub(crate) fn set_state(&self, state: SessionState) {
        self.state.store(state as u8, Ordering::Relaxed);
    }

    /// Notes traffic at `now`.
    pub(crate) fn touch(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.started).as_millis() as u64;
        self.last_activity_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// How long the session has been without traffic at `now`.
    pub(crate) fn idle_for(&self, now: Instant) -> Duration {
        let last =
            self.started + Duration::from_millis(self.last_activity_ms.load(Ordering::Relaxed));
        now.saturating_duration_since(last)
    }

    fn snapshot(&self, now: Instant) -> SessionInfo {
        SessionInfo {
            id: self.id,
            client: self.client,
            destination: self.destination.clone(),
            entry: self.entry.clone(),
            peer: self.peer.clone(),
            route: self.route,
            state: SessionState::from_u8(self.state.load(Ordering::Relaxed)),
            age: now.saturating_duration_since(self.started),
            idle: self.idle_for(now),
            bytes_from_client: self.from_client.load(Ordering::Relaxed),
            bytes_from_server: self.from_server.load(Ordering::Relaxed),
        }
    }
}

/// A copy of one session's record.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionInfo {
    pub id: u64,
    pub client: ClientAddr,
    /// Where the session goes: an address, or a name (a forwarding listener's target).
    pub destination: Target,
    pub entry: Entry,
    /// The peer gateway: where a tunnel session goes, where an inbound one came from, whose
    /// failure a bypassed one works around (`None` when no peer serves the destination).
    pub peer: Option<String>,
    pub route: Route,
    pub state: SessionState,
    pub age: Duration,
    /// Time since the last byte either way.
    pub idle: Duration,
    pub bytes_from_client: u64,
    pub bytes_from_server: u64,
}

/// All live sessions, and the totals of all sessions since the start.
#[derive(Debug)]
pub(crate) struct Sessions {
    next_id: AtomicU64,
    table: Mutex<HashMap<u64, Arc<Session>>>,
    pub(crate) totals: Totals,
}

impl Default for Sessions {
    fn default() -> Self {
        Self {
            next_id: AtomicU64::new(0),
            table: Mutex::new(HashMap::new()),
            totals: Totals::new(Instant::now()),
        }
    }
}

impl Sessions {
    /// Registers a session; it leaves the table when the guard drops. `kill` ends it.
    pub(crate) fn register(
        self: &Arc<Self>,
        now: Instant,
        client: ClientAddr,
        (destination, entry): (Target, Entry),
        peer: Option<String>,
        route: Route,
        kill: CancellationToken,
    ) -> SessionGuard {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        self.totals.opened[route as usize].fetch_add(1, Ordering::Relaxed);
        self.totals.live[route as usize].fetch_add(1, Ordering::Relaxed);
        self.totals.entered(&entry);
        let traffic = self.totals.traffic(peer.as_deref(), route);
        let session = Arc::new(Session {
            id,
            client,
            destination,
            entry,
            peer,
            route,
            started: now,
            from_client: AtomicU64::new(0),
            from_server: AtomicU64::new(0),
            last_activity_ms: AtomicU64::new(0),
            state: AtomicU8::new(SessionState::Connecting as u8),
            traffic,
            kill,
        });
        self.lock().insert(id, session.clone());
        SessionGuard {
            sessions: self.clone(),
            session,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    pub(crate) fn snapshot(&self, now: Instant) -> Vec<SessionInfo> {
        let mut list: Vec<SessionInfo> = self.lock().values().map(|s| s.snapshot(now)).collect();
        list.sort_by_key(|s| s.id);
        list
    }

    pub(crate) fn get(&self, id: u64, now: Instant) -> Option<SessionInfo> {
        self.lock().get(&id).map(|s| s.snapshot(now))
    }

    /// Ends session `id` now (both sides reset); false if there is no such live session.
    pub(crate) fn kill(&self, id: u64) -> bool {
        match self.lock().get(&id) {
            Some(s) => {
                s.kill.cancel();
                true
            }
            None => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Session>>> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How sessions ended or were refused, counted since the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    Completed,
    /// The client or the server reset its connection (its application's choice).
    Reset,
    Failed,
    Idle,
    Killed,
    Shutdown,
    /// Over the session limit (an outbound one was bypassed, an inbound one refused).
    RefusedLimit,
    /// The peer was down and its policy is to reject.
    RefusedPeerDown,
    /// The server (or, bypassing, the destination) could not be reached.
    ConnectFailed,
    /// Refused by a discard scenario.
    Discarded,
}

impl Ending {
    /// How many there are (the last is `Discarded`).
    const COUNT: usize = Ending::Discarded as usize + 1;
}

/// Byte counters of the sessions of one peer and route.
#[derive(Debug, Default)]
pub(crate) struct Traffic {
    pub(crate) from_client: AtomicU64,
    pub(crate) from_server: AtomicU64,
}

/// The gateway's running totals: plain counters, read by the API and metrics.
#[derive(Debug)]
pub(crate) struct Totals {
    started: Instant,
    /// Indexed by `Route as usize`: sessions opened, and those live now (so that counting
    /// them does not copy the table).
    opened: [AtomicU64; Route::ALL.len()],
    live: [AtomicU64; Route::ALL.len()],
    endings: [AtomicU64; Ending::COUNT],
    traffic: Mutex<HashMap<TrafficKey, Arc<Traffic>>>,
    /// Sessions opened by entry point (a handful: one per listener, plus interception and
    /// the tunnel), never shrinking.
    entries: Mutex<HashMap<Entry, u64>>,
}

/// A peer (`None`: no peer) and a route.
type TrafficKey = (Option<String>, Route);

impl Totals {
    fn new(started: Instant) -> Self {
        Self {
            started,
            opened: Default::default(),
            live: Default::default(),
            endings: Default::default(),
            traffic: Mutex::new(HashMap::new()),
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn entered(&self, entry: &Entry) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        match entries.get_mut(entry) {
            Some(n) => *n += 1,
            None => {
                entries.insert(entry.clone(), 1);
            }
        }
    }

    pub(crate) fn count(&self, ending: Ending) {
        self.endings[ending as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The counters for `peer` and `route`, created on first use (once per peer and route:
    /// the set is small and never shrinks, so that totals never go backwards).
    fn traffic(&self, peer: Option<&str>, route: Route) -> Arc<Traffic> {
        let mut map = self.traffic.lock().unwrap_or_else(PoisonError::into_inner);
        map.entry((peer.map(str::to_owned), route))
            .or_default()
            .clone()
    }

    pub(crate) fn snapshot(&self, now: Instant) -> GatewayTotals {
        let ending = |e: Ending| self.endings[e as usize].load(Ordering::Relaxed);
        let mut traffic: Vec<TrafficTotals> = self
            .traffic
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|((peer, route), t)| TrafficTotals {
                peer: peer.clone(),
                route: *route,
                from_client: t.from_client.load(Ordering::Relaxed),
                from_server: t.from_server.load(Ordering::Relaxed),
            })
            .collect();
        traffic.sort_by(|a, b| (&a.peer, a.route as u8).cmp(&(&b.peer, b.route as u8)));
        let mut opened_by_entry: Vec<(Entry, u64)> = self
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(entry, n)| (entry.clone(), *n))
            .collect();
        opened_by_entry.sort();
        GatewayTotals {
            uptime: now.saturating_duration_since(self.started),
            opened: Route::ALL
                .map(|r| (r, self.opened[r as usize].load(Ordering::Relaxed)))
                .to_vec(),
            live: Route::ALL
                .map(|r| (r, self.live[r as usize].load(Ordering::Relaxed)))
                .to_vec(),
            completed: ending(Ending::Completed),
            reset: ending(Ending::Reset),
            failed: ending(Ending::Failed),
            idle: ending(Ending::Idle),
            killed: ending(Ending::Killed),
            shutdown: ending(Ending::Shutdown),
            refused_limit: ending(Ending::RefusedLimit),
            refused_peer_down: ending(Ending::RefusedPeerDown),
            connect_failed: ending(Ending::ConnectFailed),
            discarded: ending(Ending::Discarded),
            traffic,
            opened_by_entry,
        }
    }
}

/// What the gateway did since it started.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GatewayTotals {
    pub uptime: Duration,
    /// Sessions opened, and live now, by route.
    pub opened: Vec<(Route, u64)>,
    pub live: Vec<(Route, u64)>,
    /// Sessions that ended: both directions finished, an end (client or server) reset its
    /// connection, a side failed otherwise, idle, killed through
    /// [`Gateway::kill_session`](crate::Gateway::kill_session), aborted at shutdown.
    pub completed: u64,
    pub reset: u64,
    pub failed: u64,
    pub idle: u64,
    pub killed: u64,
    pub shutdown: u64,
    /// Connections over the session limit (bypassed when outbound, refused when inbound),
    /// rejected because their peer was down, or whose server could not be reached.
    pub refused_limit: u64,
    pub refused_peer_down: u64,
    pub connect_failed: u64,
    /// Refused by a discard scenario of the shaper.
    pub discarded: u64,
    /// Session bytes by peer and route.
    pub traffic: Vec<TrafficTotals>,
    /// Sessions opened, by entry point (interception, each listener, the tunnel), for the
    /// entry points that have had one.
    pub opened_by_entry: Vec<(Entry, u64)>,
}

/// Session bytes of one peer (`None`: bypassed with no peer) and route.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TrafficTotals {
    pub peer: Option<String>,
    pub route: Route,
    pub from_client: u64,
    pub from_server: u64,
}

/// A registered session; dropping it removes the session from the table.
#[derive(Debug)]
pub(crate) struct SessionGuard {
    sessions: Arc<Sessions>,
    session: Arc<Session>,
}

impl std::ops::Deref for SessionGuard {
    type Target = Session;
    fn deref(&self) -> &Session {
        &self.session
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.sessions.lock().remove(&self.session.id);
        self.sessions.totals.live[self.session.route as usize].fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_listed_until_its_guard_drops() {
        let sessions = Arc::new(Sessions::default());
        let now = Instant::now();
        let client = ClientAddr("10.0.0.1:1000".parse().unwrap_or_else(|e| panic!("{e}")));
        let destination = Target::Addr("10.0.1.1:80".parse().unwrap_or_else(|e| panic!("{e}")));
        let to = || (destination.clone(), Entry::Intercepted);
        let kill = CancellationToken::new();
        let a = sessions.register(
            now,
            client,
            to(),
            Some("hq".into()),
            Route::Tunnel,
            kill.child_token(),
        );
        let b = sessions.register(now, client, to(), None, Route::Bypass, kill.child_token());
        assert!(sessions.kill(b.id));
        assert!(b.kill.is_cancelled() && !a.kill.is_cancelled());
        assert!(!sessions.kill(999));
        a.from_client.fetch_add(10, Ordering::Relaxed);
        a.set_state(SessionState::Open);
        let list = sessions.snapshot(now);
        assert_eq!(list.len(), 2);
        assert_eq!(
            (list[0].id, list[0].bytes_from_client, list[0].state),
            (a.id, 10, SessionState::Open)
        );
        assert_eq!(list[1].route, Route::Bypass);
        drop(a);
        assert_eq!(sessions.len(), 1);
        drop(b);
        assert_eq!(sessions.len(), 0);
    }

    #[test]
    fn totals_outlive_the_sessions() {
        let sessions = Arc::new(Sessions::default());
        let now = Instant::now();
        let addr = "10.0.0.1:1".parse().unwrap_or_else(|e| panic!("{e}"));
        for _ in 0..2 {
            let s = sessions.register(
                now,
                ClientAddr(addr),
                (Target::Addr(addr), Entry::Intercepted),
                Some("hq".into()),
                Route::Tunnel,
                CancellationToken::new(),
            );
            s.traffic.from_client.fetch_add(100, Ordering::Relaxed);
            sessions.totals.count(Ending::Completed);
        }
        sessions.totals.count(Ending::RefusedLimit);
        let t = sessions.totals.snapshot(now);
        assert_eq!(sessions.len(), 0);
        assert_eq!(
            t.opened,
            [
                (Route::Tunnel, 2),
                (Route::Inbound, 0),
                (Route::Bypass, 0),
                (Route::Direct, 0)
            ]
        );
        assert_eq!((t.completed, t.refused_limit, t.failed), (2, 1, 0));
        assert!(t.live.iter().all(|(_, n)| *n == 0), "{:?}", t.live);
        assert_eq!(t.traffic.len(), 1);
        assert_eq!(
            (t.traffic[0].peer.as_deref(), t.traffic[0].from_client),
            (Some("hq"), 200)
        );
        assert_eq!(t.opened_by_entry, [(Entry::Intercepted, 2)]);
    }

    #[test]
    fn sessions_are_counted_by_entry_point() {
        let sessions = Arc::new(Sessions::default());
        let now = Instant::now();
        let addr = "10.0.0.1:1".parse().unwrap_or_else(|e| panic!("{e}"));
        let entries = [
            Entry::Socks("apps".into()),
            Entry::Forward("db".into()),
            Entry::Tunnel,
            Entry::Forward("db".into()),
            Entry::Forward("web".into()),
        ];
        for entry in entries {
            let route = Route::Tunnel;
            let kill = CancellationToken::new();
            sessions.register(
                now,
                ClientAddr(addr),
                (Target::Addr(addr), entry),
                None,
                route,
                kill,
            );
        }
        let t = sessions.totals.snapshot(now);
        assert_eq!(
            t.opened_by_entry,
            [
                (Entry::Forward("db".into()), 2),
                (Entry::Forward("web".into()), 1),
                (Entry::Socks("apps".into()), 1),
                (Entry::Tunnel, 1),
            ]
        );
    }

    #[test]
    fn idle_time_counts_from_the_last_traffic() {
        let sessions = Arc::new(Sessions::default());
        let start = Instant::now();
        let addr = "10.0.0.1:1".parse().unwrap_or_else(|e| panic!("{e}"));
        let s = sessions.register(
            start,
            ClientAddr(addr),
            (Target::Addr(addr), Entry::Intercepted),
            None,
            Route::Inbound,
            CancellationToken::new(),
        );
        s.touch(start + Duration::from_secs(5));
        assert_eq!(
            s.idle_for(start + Duration::from_secs(7)),
            Duration::from_secs(2)
        );
        // An older touch does not move it back.
        s.touch(start + Duration::from_secs(1));
        assert_eq!(
            s.idle_for(start + Duration::from_secs(7)),
            Duration::from_secs(2)
        );
    }
}
