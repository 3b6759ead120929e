//! The session table: every relayed connection, with its addresses, route and byte counts.

use crate::addrs::{ClientAddr, OrigDstAddr};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How a session is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Route {
    /// Intercepted here and carried through the tunnel to a peer.
    Tunnel,
    /// Arrived through the tunnel; this gateway re-originated it to the server.
    Inbound,
    /// Intercepted here and connected directly to the server, because the peer was down,
    /// bypass was forced, or no tunnel stream was available.
    Bypass,
}

impl Route {
    pub fn as_str(self) -> &'static str {
        match self {
            Route::Tunnel => "tunnel",
            Route::Inbound => "inbound",
            Route::Bypass => "bypass",
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
    pub(crate) destination: OrigDstAddr,
    pub(crate) peer: Option<String>,
    pub(crate) route: Route,
    pub(crate) started: Instant,
    /// Bytes read from the client side and from the server side.
    pub(crate) from_client: AtomicU64,
    pub(crate) from_server: AtomicU64,
    /// Milliseconds after `started` of the last byte either way.
    pub(crate) last_activity_ms: AtomicU64,
    state: AtomicU8,
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
            destination: self.destination,
            peer: self.peer.clone(),
            route: self.route,
            state: SessionState::from_u8(self.state.load(Ordering::Relaxed)),
            age: now.saturating_duration_since(self.started),
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
    pub destination: OrigDstAddr,
    /// The peer gateway: where a tunnel session goes, where an inbound one came from, whose
    /// failure a bypassed one works around (`None` when no peer serves the destination).
    pub peer: Option<String>,
    pub route: Route,
    pub state: SessionState,
    pub age: Duration,
    pub bytes_from_client: u64,
    pub bytes_from_server: u64,
}

/// All live sessions.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    next_id: AtomicU64,
    table: Mutex<HashMap<u64, Arc<Session>>>,
}

impl Sessions {
    /// Registers a session; it leaves the table when the guard drops.
    pub(crate) fn register(
        self: &Arc<Self>,
        now: Instant,
        client: ClientAddr,
        destination: OrigDstAddr,
        peer: Option<String>,
        route: Route,
    ) -> SessionGuard {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let session = Arc::new(Session {
            id,
            client,
            destination,
            peer,
            route,
            started: now,
            from_client: AtomicU64::new(0),
            from_server: AtomicU64::new(0),
            last_activity_ms: AtomicU64::new(0),
            state: AtomicU8::new(SessionState::Connecting as u8),
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Session>>> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
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
        let destination = OrigDstAddr("10.0.1.1:80".parse().unwrap_or_else(|e| panic!("{e}")));
        let a = sessions.register(now, client, destination, Some("hq".into()), Route::Tunnel);
        let b = sessions.register(now, client, destination, None, Route::Bypass);
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
    fn idle_time_counts_from_the_last_traffic() {
        let sessions = Arc::new(Sessions::default());
        let start = Instant::now();
        let addr = "10.0.0.1:1".parse().unwrap_or_else(|e| panic!("{e}"));
        let s = sessions.register(
            start,
            ClientAddr(addr),
            OrigDstAddr(addr),
            None,
            Route::Inbound,
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
