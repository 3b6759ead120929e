//! The driver: an [`Endpoint`] and its connections on a real UDP socket (feature `driver`).
//!
//! # Shape
//!
//! One tokio task per socket (the *I/O task*) owns the socket, the pacing timer and the list
//! of connections. Each connection sits behind its own mutex, shared with the application's
//! [`Tunnel`] and [`Stream`] handles, as in quinn. Locks are held only for a call into the
//! sans-IO core, never across a system call or an `.await`:
//!
//! ```text
//!             ┌──────────── I/O task ────────────┐
//!  socket ──> │ recvmmsg/GRO ─> Endpoint (route) │ ──lock──> Connection ──> events ─> wakers
//!  socket <── │ GSO sendmsg <─ poll_transmit     │ <─lock─── Connection <── Stream::write
//!  timerfd ─> │ handle_timeout (pacing, loss)    │            (touch: wake the I/O task)
//!             └──────────────────────────────────┘
//! ```
//!
//! An application call that gives a connection something to send (a write, a read that
//! frees window, a finish, a control message) marks the connection and wakes the I/O task,
//! which then asks only marked connections, connections that received datagrams and
//! connections whose timer is due for transmits.
//!
//! Reader wake-ups: at 100 Mbit/s paced datagrams arrive one at a time, and waking a stream's
//! reader for each would cost a task wake-up and a small write to the far socket per datagram.
//! A reader woken for data is therefore woken again at most every 16 ms while a flow streams
//! (half that when it is woken with other readers, see below), or sooner once 64 KiB wait.
//! The end of what the peer's application had written (a STREAM frame marked PUSH, or FIN)
//! wakes it within 1 ms instead (RTT/8 on paths under 8 ms), so the tail of an answer is not
//! held back; and the first data after a quiet spell wakes it at once, so a request that
//! arrives alone is not delayed. Readers of flows that stream
//! side by side are woken in step (see `LinkState::wake_readers`).
//!
//! Receive moderation: the same datagrams would also wake the I/O task one at a time, each
//! wake-up a context switch. While they stream in, the task stops watching the socket for
//! a hold after each receive (as long as sixteen arrivals take, at most RTT/8 and 2 ms; none
//! under 50 µs or without a connection) and takes what came meanwhile in one batch; see
//! `Moderation` and, for how the socket is watched, `socket::Watched`.
//!
//! Pacing: the core releases one burst (~2 ms of data, one GSO send) when the pacer allows
//! it and otherwise reports the next departure through `poll_timeout`; the driver sleeps on a
//! timerfd until then (see `timer.rs` for why not tokio's timer).
//!
//! The driver is the only place that reads the clock.

mod socket;
mod stream;
mod timer;

pub use socket::SOCKET_BUFFER;
pub use stream::Stream;
pub use timer::Timer;

use crate::FastMap;
use crate::config::{EndpointConfig, FecMode};
use crate::connection::{Connection, ConnectionError, ConnectionStats, ControlError, Event};
use crate::crypto::PublicKey;
use crate::endpoint::{ConnectError, ConnectionHandle, DatagramEvent, Endpoint, EndpointStats};
use crate::rtt::RttEstimator;
use crate::streams::StreamError;
use crate::wire::{StreamId, StreamMeta};
use quinn_udp::UdpSocketState;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tracing::Instrument;

/// Receive calls made per wake-up before the task turns to sending: acknowledgements must
/// not wait behind a long burst of arrivals.
const RECEIVE_CALLS_PER_ROUND: usize = 16;

/// The longest an arriving datagram waits while the driver takes arrivals in batches (see
/// [`Moderation`]). A connection whose smoothed RTT is under 16 ms allows RTT/8 (the share
/// of the round trip an early ACK may already wait, see `connection::ack`). At 10 ms and
/// 100 Mbit/s, RTT/64 (156 µs, 1.4 datagrams a wake-up) had cost the receiving gateway three
/// times its CPU per GB at 100 ms. Ten sessions at 100 ms and 100 Mbit/s: 1 ms (eight
/// datagrams a wake-up, 1,000 wake-ups a second) left the receiving gateway 15-25 % dearer
/// than the sending one, which wakes once per 2 ms pacing burst; 2 ms brought it level, and
/// the exchanges' median rose by 0.1-0.2 ms of 107. The hold barely shows in RTT samples: an
/// ACK reports the largest packet it acknowledges, and that one arrived last, at most one
/// arrival gap before the hold ended.
const MAX_RECEIVE_HOLD: Duration = Duration::from_millis(2);

/// The share of the smoothed RTT a connection lets its arrivals be held.
const RECEIVE_HOLD_RTT_SHARE: u32 = 8;

/// The shortest hold worth a timer wake-up: arrivals faster than [`RECEIVE_BATCH`] in this
/// time fill a batch while a wake-up takes place, and on paths under 400 µs (RTT/8 below
/// it) nothing is held.
const MIN_RECEIVE_HOLD: Duration = Duration::from_micros(50);

/// The datagrams a receive hold waits for, at the rate they arrive (see [`Moderation`]):
/// one wake-up for sixteen arrivals, at 100 Mbit/s one per 2 ms pacing burst of the sender,
/// as often as the sending gateway wakes.
const RECEIVE_BATCH: u32 = 16;

/// Transmits taken from one connection per round, so that one busy connection cannot starve
/// the others of the socket. A paced connection yields far fewer (one burst per pacing
/// interval).
const TRANSMITS_PER_ROUND: usize = 64;

/// The longest a stream reader's wake-up waits for more data after the reader was last woken
/// for data; see the module documentation. At 4 ms, ten sessions sharing 100 Mbit/s had
/// their readers woken (and wrote the far sockets) 2,500 times a second, ~5 KB each; at
/// 16 ms the receiving gateway's CPU per GB fell by a fifth. It does not shrink with the
/// RTT: data still streaming is not what anyone waits for (the end of what the peer wrote
/// carries PUSH), and on a 10 ms path RTT/8 had woken a bulk flow's reader 800 times a
/// second.
const MAX_READ_DELAY: Duration = Duration::from_millis(16);

/// The same once the data up to a PUSH (the end of what the peer had to send) is in; RTT/8
/// on paths under 8 ms.
const MAX_PUSH_DELAY: Duration = Duration::from_millis(1);

/// Bytes waiting for a stream reader that wake it without further delay.
const READ_LOW_WATER: usize = 64 * 1024;

/// How long a shutting-down driver waits for its connections to finish closing.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The longest flush a shutdown takes (a larger one is cut to it).
const MAX_FLUSH: Duration = Duration::from_secs(3600);

/// The driver reads the clock; the core never does.
#[allow(
    clippy::disallowed_methods,
    reason = "the driver is where time comes from"
)]
fn now() -> Instant {
    Instant::now()
}

#[allow(
    clippy::disallowed_methods,
    reason = "the driver is where time comes from"
)]
fn unix_time() -> Duration {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
}

/// Counters of the socket and the endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DriverStats {
    /// Datagrams received (GRO batches counted by segment).
    pub datagrams_received: u64,
    /// `recvmmsg`/`recvmsg` calls that returned data.
    pub receive_calls: u64,
    /// Datagrams sent.
    pub datagrams_sent: u64,
    /// `sendmsg` calls (one per GSO batch).
    pub send_calls: u64,
    /// Sends the kernel refused with an error other than a full buffer.
    pub send_errors: u64,
    pub endpoint: EndpointStats,
}

/// Runs an endpoint on a UDP socket. See the module documentation.
///
/// Dropping the driver closes every connection (CLOSE frames are sent) and stops the I/O
/// task once they are closed, or after a short grace period.
#[derive(Debug)]
pub struct Driver {
    shared: Arc<Shared>,
    incoming: tokio::sync::Mutex<mpsc::UnboundedReceiver<Tunnel>>,
    task: Option<JoinHandle<()>>,
}

impl Driver {
    /// Binds a UDP socket at `addr` (an unspecified IPv6 address serves IPv4 too) with
    /// [`SOCKET_BUFFER`]-sized kernel buffers and starts the I/O task on the current tokio
    /// runtime.
    pub fn bind(addr: SocketAddr, config: EndpointConfig) -> io::Result<Self> {
        let socket = socket::bind(addr)?;
        socket::set_buffers(&socket, SOCKET_BUFFER);
        Self::from_socket(socket, config)
    }

    /// Runs on a socket the caller created and configured (a mark, a device binding, buffer
    /// sizes). It is switched to non-blocking mode.
    pub fn from_socket(socket: std::net::UdpSocket, config: EndpointConfig) -> io::Result<Self> {
        socket.set_nonblocking(true)?;
        let state = UdpSocketState::new((&socket).into())?;
        let local_addr = socket.local_addr()?;
        let endpoint = Endpoint::new(config);
        let (accepted, incoming) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            wake: Notify::new(),
            core: Mutex::new(Core {
                endpoint,
                added: Vec::new(),
            }),
            shutdown: AtomicBool::new(false),
            flush_ms: AtomicU64::new(0),
            local_addr,
            stats: Counters::default(),
            #[cfg(test)]
            blocked: Mutex::new(Vec::new()),
        });
        let (max_datagram, max_burst) = send_limits(&shared);
        let linger = shared.core().endpoint.transport_config().idle_timeout;
        let io = Io {
            linger,
            recv: socket::RecvBuffers::new(&state),
            send: vec![0; crate::connection::send_buffer_len(max_datagram, max_burst)]
                .into_boxed_slice(),
            max_datagram,
            max_burst,
            ipv6_socket: local_addr.is_ipv6(),
            shared: shared.clone(),
            socket: socket::Watched::new(socket)?,
            state,
            moderation: Moderation::default(),
            undrained: false,
            timer: timer::Timer::new()?,
            connections: FastMap::default(),
            accepted,
            routes: Vec::new(),
            write_blocked: false,
        };
        let span = tracing::info_span!("tunnel driver", local = %local_addr);
        let task = tokio::spawn(io.run().instrument(span));
        Ok(Self {
            shared,
            incoming: tokio::sync::Mutex::new(incoming),
            task: Some(task),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    pub fn public_key(&self) -> PublicKey {
        self.shared.core().endpoint.public_key()
    }

    /// Starts a connection to `peer` at `remote`; wait for it with [`Tunnel::established`].
    pub fn connect(&self, remote: SocketAddr, peer: PublicKey) -> Result<Tunnel, ConnectError> {
        let mut core = self.shared.core();
        let (handle, connection) = core.endpoint.connect(now(), unix_time(), remote, peer)?;
        let link = Link::new(handle, peer, connection, self.shared.clone());
        core.added.push(link.clone());
        drop(core);
        self.shared.wake.notify_one();
        Ok(Tunnel { link })
    }

    /// Replaces the peers allowed to connect; see [`Endpoint::set_peers`].
    pub fn set_peers(&self, peers: Vec<PublicKey>) {
        self.shared.core().endpoint.set_peers(peers);
    }

    /// The next connection a peer initiated; `None` once the driver has stopped.
    pub async fn accept(&self) -> Option<Tunnel> {
        self.incoming.lock().await.recv().await
    }

    pub fn stats(&self) -> DriverStats {
        let c = &self.shared.stats;
        DriverStats {
            datagrams_received: c.datagrams_received.load(Ordering::Relaxed),
            receive_calls: c.receive_calls.load(Ordering::Relaxed),
            datagrams_sent: c.datagrams_sent.load(Ordering::Relaxed),
            send_calls: c.send_calls.load(Ordering::Relaxed),
            send_errors: c.send_errors.load(Ordering::Relaxed),
            endpoint: self.shared.core().endpoint.stats(),
        }
    }

    /// Lets each connection deliver what its streams sent (OPENs, data, FINs, resets) for
    /// up to `flush`, closes it as soon as it has or when that time is up, and waits until
    /// the I/O task has stopped. Data an application wrote before it let go of a stream
    /// reaches the peer even if the process stops right after.
    pub async fn shutdown(mut self, flush: Duration) {
        let flush_ms = u64::try_from(flush.min(MAX_FLUSH).as_millis()).unwrap_or(u64::MAX);
        self.shared.flush_ms.store(flush_ms, Ordering::Relaxed);
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.wake.notify_one();
        if let Some(task) = self.task.take() {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "tunnel driver task failed");
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.wake.notify_one();
    }
}

/// One connection to a peer, as the application holds it. Clones share the connection and
/// compare equal.
///
/// When the last handle to a connection is gone (every `Tunnel` clone and every [`Stream`]),
/// the driver closes it with [`Tunnel::CLOSE_DROPPED`] as soon as what its streams sent has
/// been delivered (waiting the transport's `idle_timeout` at most): nobody is left to use
/// it.
#[derive(Debug, Clone)]
pub struct Tunnel {
    link: Arc<Link>,
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        // The I/O task closes the connection if this was the last handle.
        self.link.touch();
    }
}

impl PartialEq for Tunnel {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.link, &other.link)
    }
}

impl Eq for Tunnel {}

impl Tunnel {
    /// The close code of a connection whose handles were all dropped.
    pub const CLOSE_DROPPED: u64 = 0;

    /// The reason sent with [`Self::CLOSE_DROPPED`].
    pub const CLOSE_DROPPED_REASON: &[u8] = b"dropped";

    pub fn peer(&self) -> PublicKey {
        self.link.peer
    }

    pub fn remote_address(&self) -> SocketAddr {
        self.link.lock().connection.remote_address()
    }

    pub fn stats(&self) -> ConnectionStats {
        self.link.lock().connection.stats()
    }

    /// Changes the forward error correction of what this side sends; see
    /// [`Connection::set_fec`](crate::Connection::set_fec).
    pub fn set_fec(&self, mode: FecMode, max_overhead: f64) {
        self.link.lock().connection.set_fec(mode, max_overhead);
    }

    /// Hands the order in which this tunnel's streams send to `scheduler`; see
    /// [`Connection::set_scheduler`](crate::Connection::set_scheduler).
    pub fn set_scheduler(&self, scheduler: Box<dyn crate::Scheduler>) {
        self.link.lock().connection.set_scheduler(scheduler);
        self.link.touch();
    }

    /// Whether the handshake has completed and the connection has not ended.
    pub fn is_established(&self) -> bool {
        let state = self.link.lock();
        state.error.is_none() && state.connection.is_established()
    }

    /// How long ago an authenticated packet last arrived from the peer; see
    /// [`Connection::last_heard`](crate::Connection::last_heard).
    pub fn silent_for(&self) -> Duration {
        let heard = self.link.lock().connection.last_heard();
        now().saturating_duration_since(heard)
    }

    /// What the peer's application understands; see
    /// [`Connection::peer_app_extensions`](crate::Connection::peer_app_extensions).
    pub fn peer_app_extensions(&self) -> u32 {
        self.link.lock().connection.peer_app_extensions()
    }

    /// The smoothed round-trip time.
    pub fn rtt(&self) -> Duration {
        self.link.lock().connection.rtt().smoothed()
    }

    /// Why the connection ended, once it has.
    pub fn error(&self) -> Option<ConnectionError> {
        self.link.lock().error.clone()
    }

    /// Completes when the handshake has; fails if the connection ended first.
    pub async fn established(&self) -> Result<(), ConnectionError> {
        poll_fn(|cx| {
            let mut state = self.link.lock();
            if let Some(e) = &state.error {
                return Poll::Ready(Err(e.clone()));
            }
            if state.connection.is_established() {
                return Poll::Ready(Ok(()));
            }
            register(&mut state.waiters, cx);
            Poll::Pending
        })
        .await
    }

    /// Opens a stream carrying `meta` to the peer. Data can be written at once; it leaves
    /// when the handshake has completed.
    pub fn open(&self, meta: StreamMeta) -> Result<Stream, StreamError> {
        let mut state = self.link.lock();
        let id = state.connection.open_stream(meta.clone())?;
        let stream = Stream::new(self.link.clone(), &mut state, id, meta);
        drop(state);
        self.link.touch();
        Ok(stream)
    }

    /// The next stream the peer opened.
    pub async fn accept_stream(&self) -> Result<Stream, ConnectionError> {
        poll_fn(|cx| {
            let mut state = self.link.lock();
            while let Some(id) = state.incoming.pop_front() {
                // A stream the peer already reset and the core forgot has no metadata left.
                if let Some(meta) = state.connection.stream_meta(id) {
                    let meta = meta.clone();
                    let stream = Stream::new(self.link.clone(), &mut state, id, meta);
                    return Poll::Ready(Ok(stream));
                }
            }
            if let Some(e) = &state.error {
                return Poll::Ready(Err(e.clone()));
            }
            register(&mut state.waiters, cx);
            Poll::Pending
        })
        .await
    }

    /// Queues a control message; it is delivered reliably and in order.
    pub fn send_control(&self, message: &[u8]) -> Result<(), ControlError> {
        self.link.lock().connection.send_control(message)?;
        self.link.touch();
        Ok(())
    }

    /// The next control message from the peer.
    pub async fn recv_control(&self) -> Result<Vec<u8>, ConnectionError> {
        poll_fn(|cx| {
            let mut state = self.link.lock();
            if let Some(message) = state.controls.pop_front() {
                return Poll::Ready(Ok(message));
            }
            if let Some(e) = &state.error {
                return Poll::Ready(Err(e.clone()));
            }
            register(&mut state.waiters, cx);
            Poll::Pending
        })
        .await
    }

    /// Closes the connection: every stream ends, the peer is told with `code` (below 0x100:
    /// the transport's own codes start there) and `reason`.
    pub fn close(&self, code: u64, reason: &[u8]) {
        self.link.lock().connection.close(now(), code, reason);
        self.link.touch();
    }

    /// Completes when the connection has ended, with the reason.
    pub async fn closed(&self) -> ConnectionError {
        poll_fn(|cx| {
            let mut state = self.link.lock();
            if let Some(e) = &state.error {
                return Poll::Ready(e.clone());
            }
            register(&mut state.waiters, cx);
            Poll::Pending
        })
        .await
    }
}

/// Adds `cx`'s waker to `wakers` unless it is there already.
fn register(wakers: &mut Vec<Waker>, cx: &Context<'_>) {
    if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
        wakers.push(cx.waker().clone());
    }
}

/// Makes `cx`'s task the one `slot` wakes.
fn register_once(slot: &mut Option<Waker>, cx: &Context<'_>) {
    if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
        *slot = Some(cx.waker().clone());
    }
}

/// What the I/O task and the application handles share about the whole socket.
#[derive(Debug)]
struct Shared {
    /// Wakes the I/O task: a connection was marked or added, or shutdown was asked for.
    wake: Notify,
    core: Mutex<Core>,
    shutdown: AtomicBool,
    /// How long a shutdown lets the connections deliver what their streams sent (ms; set
    /// before `shutdown`).
    flush_ms: AtomicU64,
    local_addr: SocketAddr,
    stats: Counters,
    /// Destinations whose sends the tests make find a full socket buffer.
    #[cfg(test)]
    blocked: Mutex<Vec<SocketAddr>>,
}

impl Shared {
    #[cfg(test)]
    fn is_blocked(&self, destination: SocketAddr) -> bool {
        let blocked = self.blocked.lock().unwrap_or_else(PoisonError::into_inner);
        blocked.contains(&destination)
    }

    fn core(&self) -> MutexGuard<'_, Core> {
        // A panic while holding the lock leaves the endpoint as consistent as its last
        // completed call; carry on with it.
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug)]
struct Core {
    endpoint: Endpoint,
    /// Connections started by `connect`, for the I/O task to adopt.
    added: Vec<Arc<Link>>,
}

#[derive(Debug, Default)]
struct Counters {
    datagrams_received: AtomicU64,
    receive_calls: AtomicU64,
    datagrams_sent: AtomicU64,
    send_calls: AtomicU64,
    send_errors: AtomicU64,
}

/// One connection, shared between the I/O task and the application's handles.
#[derive(Debug)]
struct Link {
    handle: ConnectionHandle,
    peer: PublicKey,
    state: Mutex<LinkState>,
    /// Set by the application when the connection may have something new to send.
    marked: AtomicBool,
    shared: Arc<Shared>,
}

impl Link {
    fn new(
        handle: ConnectionHandle,
        peer: PublicKey,
        connection: Connection,
        shared: Arc<Shared>,
    ) -> Arc<Self> {
        Arc::new(Self {
            handle,
            peer,
            state: Mutex::new(LinkState::new(connection)),
            marked: AtomicBool::new(true),
            shared,
        })
    }

    fn lock(&self) -> MutexGuard<'_, LinkState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tells the I/O task to look at this connection.
    fn touch(&self) {
        if !self.marked.swap(true, Ordering::AcqRel) {
            self.shared.wake.notify_one();
        }
    }
}

#[derive(Debug)]
struct LinkState {
    connection: Connection,
    error: Option<ConnectionError>,
    /// The streams that have a [`Stream`] handle.
    streams: FastMap<StreamId, StreamSlot>,
    /// Streams the peer opened, not yet accepted.
    incoming: VecDeque<StreamId>,
    controls: VecDeque<Vec<u8>>,
    /// Tasks waiting for anything connection-wide (establishment, a stream, a control
    /// message, the end).
    waiters: Vec<Waker>,
    /// Streams whose reader waits for data that has arrived, its wake-up deferred.
    deferred: Vec<StreamId>,
    /// When the first deferred reader is due.
    wake_readers_at: Option<Instant>,
}

impl LinkState {
    fn new(connection: Connection) -> Self {
        Self {
            connection,
            error: None,
            streams: FastMap::default(),
            incoming: VecDeque::new(),
            controls: VecDeque::new(),
            waiters: Vec::new(),
            deferred: Vec::new(),
            wake_readers_at: None,
        }
    }

    /// Turns the core's events into wake-ups, and wakes the deferred readers that are due.
    fn dispatch_events(&mut self, now: Instant) {
        while let Some(event) = self.connection.poll_event() {
            match event {
                Event::Connected => self.wake_waiters(),
                Event::StreamOpened(id) => {
                    self.incoming.push_back(id);
                    self.wake_waiters();
                }
                Event::StreamReadable(id) => {
                    if !self.deferred.contains(&id) {
                        self.deferred.push(id);
                    }
                }
                Event::StreamWritable(id) => {
                    if let Some(slot) = self.streams.get_mut(&id) {
                        wake(slot.writer.take());
                    }
                }
                Event::StreamReset { id, code } => {
                    if let Some(slot) = self.streams.get_mut(&id) {
                        slot.reset = Some(code);
                        slot.wake();
                    }
                }
                Event::Control(message) => {
                    self.controls.push_back(message);
                    self.wake_waiters();
                }
                Event::ConnectionLost(e) => {
                    tracing::debug!(error = %e, "connection ended");
                    self.error = Some(e);
                    self.wake_all();
                }
            }
        }
        if !self.deferred.is_empty() {
            self.wake_readers(now);
        }
    }

    /// Wakes each reader waiting for data that has arrived, unless it was woken for data
    /// less than the read delay ago (shorter once a PUSH is in) and fewer than
    /// [`READ_LOW_WATER`] bytes wait; those stay deferred until `wake_readers_at`.
    ///
    /// When one reader is woken, so is every other that has waited half its delay: the
    /// readers of flows that stream side by side fall into step and are woken together,
    /// one wake-up of the runtime for all of them rather than one each at its own phase.
    /// No reader is woken later for it.
    fn wake_readers(&mut self, now: Instant) {
        let streaming = MAX_READ_DELAY;
        let pushed = (self.connection.rtt().smoothed() / 8).min(MAX_PUSH_DELAY);
        let (streams, connection) = (&mut self.streams, &self.connection);
        // When each deferred reader is due, and when it would join a wake-up of others.
        let due = |id: StreamId, slot: &StreamSlot| {
            let delay = if connection.pushed(id) {
                pushed
            } else {
                streaming
            };
            match slot.last_woken {
                _ if connection.readable_bytes(id) >= READ_LOW_WATER => (now, now),
                Some(at) => (at + delay, at + delay / 2),
                None => (now, now),
            }
        };
        // Without a waiting reader there is nobody to wake: it reads before it waits.
        self.deferred
            .retain(|id| streams.get(id).is_some_and(|s| s.reader.is_some()));
        let any_due = self
            .deferred
            .iter()
            .any(|&id| streams.get(&id).is_some_and(|slot| due(id, slot).0 <= now));
        let mut next: Option<Instant> = None;
        self.deferred.retain(|id| {
            let Some(slot) = streams.get_mut(id) else {
                return false;
            };
            let (due, joins) = due(*id, slot);
            if due <= now || (any_due && joins <= now) {
                slot.last_woken = Some(now);
                wake(slot.reader.take());
                return false;
            }
            next = Some(next.map_or(due, |n| n.min(due)));
            true
        });
        self.wake_readers_at = next;
    }

    fn wake_waiters(&mut self) {
        self.waiters.drain(..).for_each(Waker::wake);
    }

    fn wake_all(&mut self) {
        self.wake_waiters();
        self.streams.values_mut().for_each(StreamSlot::wake);
    }
}

/// What the driver keeps for a stream with a handle.
#[derive(Debug, Default)]
struct StreamSlot {
    /// Tasks waiting to read or to write.
    reader: Option<Waker>,
    writer: Option<Waker>,
    /// The peer reset the stream with this code (the core has forgotten it).
    reset: Option<u64>,
    /// When the reader was last woken for data.
    last_woken: Option<Instant>,
}

impl StreamSlot {
    fn wake(&mut self) {
        wake(self.reader.take());
        wake(self.writer.take());
    }
}

fn wake(waker: Option<Waker>) {
    if let Some(w) = waker {
        w.wake();
    }
}

/// Largest datagram and most datagrams per send, from the transport settings.
fn send_limits(shared: &Shared) -> (usize, usize) {
    let core = shared.core();
    let transport = core.endpoint.transport_config();
    (
        usize::from(transport.max_datagram),
        transport.max_burst_packets.max(1),
    )
}

/// The I/O task's own state.
struct Io {
    shared: Arc<Shared>,
    socket: socket::Watched,
    state: UdpSocketState,
    moderation: Moderation,
    /// The last receive stopped before the socket was empty (see
    /// [`RECEIVE_CALLS_PER_ROUND`]): the next round receives without waiting.
    undrained: bool,
    ipv6_socket: bool,
    timer: timer::Timer,
    connections: FastMap<ConnectionHandle, Entry>,
    accepted: mpsc::UnboundedSender<Tunnel>,
    recv: socket::RecvBuffers,
    /// The GSO buffer: `max_burst` datagrams of `max_datagram` bytes, at most one send's
    /// worth (`send_buffer_len`).
    send: Box<[u8]>,
    max_datagram: usize,
    max_burst: usize,
    /// Received datagrams routed to a connection: (offset, length, source, connection).
    routes: Vec<(usize, usize, SocketAddr, ConnectionHandle)>,
    /// A send found the socket's buffer full: a transmit is parked until it is writable.
    write_blocked: bool,
    /// How long a connection nobody holds may wait for what its streams sent to be
    /// delivered (a peer that keeps the connection alive but does not read would hold it
    /// forever): the idle timeout, the time a silent peer gets.
    linger: Duration,
}

struct Entry {
    link: Arc<Link>,
    /// How long its arrivals may be held (see [`Moderation`]), from its RTT when last
    /// serviced.
    hold: Duration,
    /// The connection's `poll_timeout` when last looked at.
    timeout: Option<Instant>,
    /// When its first deferred stream reader is due.
    wake_readers_at: Option<Instant>,
    /// Datagrams arrived since it was last serviced.
    received: bool,
    /// A transmit the socket had no room for (its bytes in `parked`): it leaves before
    /// anything new from this connection.
    parked_to: Option<(SocketAddr, (Option<usize>, u8))>,
    parked: Vec<u8>,
    /// The driver is shutting down and has closed this connection.
    closed: bool,
    /// When the driver found it held by no handle.
    unheld_since: Option<Instant>,
}

impl Io {
    async fn run(mut self) {
        // Once shutting down: when every connection closes, delivered or not.
        let mut close_by: Option<Instant> = None;
        loop {
            self.adopt_started();
            let now = now();
            if close_by.is_none() && self.shared.shutdown.load(Ordering::Acquire) {
                let flush = Duration::from_millis(self.shared.flush_ms.load(Ordering::Relaxed));
                close_by = Some(now + flush);
                // No new connections: a peer reconnecting at once would keep the flush
                // (and the driver) alive to its end.
                self.shared.core().endpoint.refuse_new();
            }
            if let Some(close_by) = close_by {
                self.close_delivered(now, now >= close_by);
            }
            if self.moderation.is_over(now) || std::mem::take(&mut self.undrained) {
                self.receive(now);
            }
            let cap = self.service(now);
            self.moderation.set_cap(cap, now);
            if let Some(close_by) = close_by {
                if self.connections.is_empty() || now >= close_by + SHUTDOWN_GRACE {
                    break;
                }
            }
            let deadlines = self.connections.values();
            let flush_ends = close_by.filter(|&t| t > now);
            match deadlines
                .flat_map(|e| [e.timeout, e.wake_readers_at])
                .chain([flush_ends, self.moderation.until])
                .flatten()
                .min()
            {
                Some(deadline) => self.timer.arm(deadline),
                None => self.timer.disarm(),
            }
            if self.undrained {
                // More waits in the socket: take it next round, after the other tasks.
                tokio::task::yield_now().await;
                continue;
            }
            match self
                .socket
                .watch(!self.moderation.is_holding(), self.write_blocked)
            {
                Ok(false) => {}
                Ok(true) => {
                    // Already there, and not to be reported: take it now.
                    self.write_blocked = false;
                    self.receive(self::now());
                    continue;
                }
                Err(e) => {
                    tracing::error!(error = %e, "tunnel socket failed; stopping");
                    break;
                }
            }
            tokio::select! {
                biased;
                ready = self.socket.ready() => match ready {
                    Ok(()) => {
                        // Room to send, or arrivals: either way a parked transmit may try again.
                        self.write_blocked = false;
                        self.receive(self::now());
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "tunnel socket failed; stopping");
                        break;
                    }
                },
                expired = self.timer.expired() => {
                    if let Err(e) = expired {
                        tracing::error!(error = %e, "tunnel timer failed; stopping");
                        break;
                    }
                }
                () = self.shared.wake.notified() => {}
            }
        }
        self.timer.disarm();
        for entry in self.connections.values() {
            let mut state = entry.link.lock();
            if state.error.is_none() {
                state.error = Some(ConnectionError::LocallyClosed);
            }
            state.wake_all();
        }
    }

    fn adopt_started(&mut self) {
        let added = std::mem::take(&mut self.shared.core().added);
        for link in added {
            self.adopt(link);
        }
    }

    fn adopt(&mut self, link: Arc<Link>) {
        self.connections.insert(
            link.handle,
            Entry {
                link,
                hold: Duration::ZERO,
                timeout: None,
                wake_readers_at: None,
                received: false,
                parked_to: None,
                parked: Vec::new(),
                closed: false,
                unheld_since: None,
            },
        );
    }

    /// Closes the connections whose streams have nothing on its way to the peer, or all
    /// of them if `all`.
    fn close_delivered(&mut self, now: Instant, all: bool) {
        for entry in self.connections.values_mut().filter(|e| !e.closed) {
            let mut state = entry.link.lock();
            if all || state.connection.is_delivered() {
                state.connection.close(now, 0, b"shutting down");
                drop(state);
                entry.closed = true;
                entry.link.marked.store(true, Ordering::Release);
            }
        }
    }

    /// Reads what the socket has and hands each datagram to the endpoint and its connection;
    /// then tells the moderation what it found.
    fn receive(&mut self, now: Instant) {
        let mut datagrams = 0;
        let mut drained = false;
        let mut errors = 0;
        for _ in 0..RECEIVE_CALLS_PER_ROUND {
            let filled = match self.recv.receive(self.socket.socket(), &self.state) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    drained = true;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // ICMP errors reported on the socket and the like: not fatal, and
                    // more may wait behind them; one that persists is not retried at once.
                    tracing::debug!(error = %e, "receive failed");
                    errors += 1;
                    if errors > 1 {
                        drained = true;
                        break;
                    }
                    continue;
                }
            };
            errors = 0;
            self.shared
                .stats
                .receive_calls
                .fetch_add(1, Ordering::Relaxed);
            datagrams += self.route(now, filled);
            self.deliver(now);
            if filled < quinn_udp::BATCH_SIZE {
                // recvmmsg stops at an empty socket: another call would only say so.
                drained = true;
                break;
            }
        }
        self.undrained = !drained;
        self.moderation.received(now, datagrams);
        if errors > 1 {
            self.moderation.back_off(now);
        }
    }

    /// Asks the endpoint where each received datagram goes; returns how many there were.
    fn route(&mut self, now: Instant, filled: usize) -> u64 {
        self.routes.clear();
        let mut new = Vec::new();
        let mut count = 0;
        {
            let mut core = self.shared.core();
            for slot in 0..filled {
                let from = socket::canonical(self.recv.meta[slot].addr);
                for (offset, len) in self.recv.segments(slot) {
                    count += 1;
                    let datagram = &self.recv.data()[offset..offset + len];
                    match core.endpoint.handle(now, from, datagram) {
                        Some(DatagramEvent::Route(handle)) => {
                            self.routes.push((offset, len, from, handle));
                        }
                        Some(DatagramEvent::NewConnection {
                            handle,
                            connection,
                            replaces,
                        }) => new.push((handle, connection, replaces)),
                        None => {}
                    }
                }
            }
        }
        self.shared
            .stats
            .datagrams_received
            .fetch_add(count, Ordering::Relaxed);
        for (handle, connection, replaces) in new {
            self.accept(handle, *connection, replaces, now);
        }
        count
    }

    fn accept(
        &mut self,
        handle: ConnectionHandle,
        connection: Connection,
        replaces: Option<ConnectionHandle>,
        now: Instant,
    ) {
        if let Some(old) = replaces.and_then(|h| self.connections.get_mut(&h)) {
            let mut state = old.link.lock();
            state.connection.replaced(now);
            state.dispatch_events(now);
            old.received = true;
        }
        let peer = connection.peer_key();
        tracing::info!(%peer, remote = %connection.remote_address(), "peer connected");
        let link = Link::new(handle, peer, connection, self.shared.clone());
        self.adopt(link.clone());
        // The receiver is gone only while the driver is being dropped.
        let _ = self.accepted.send(Tunnel { link });
    }

    /// Hands routed datagrams to their connections, one lock per run of datagrams for the
    /// same connection.
    fn deliver(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.routes.len() {
            let handle = self.routes[i].3;
            let end = self.routes[i..]
                .iter()
                .position(|r| r.3 != handle)
                .map_or(self.routes.len(), |n| i + n);
            if let Some(entry) = self.connections.get_mut(&handle) {
                let mut state = entry.link.lock();
                for &(offset, len, from, _) in &self.routes[i..end] {
                    let datagram = &mut self.recv.data_mut()[offset..offset + len];
                    state.connection.handle_datagram(now, from, datagram);
                }
                state.dispatch_events(now);
                entry.received = true;
            }
            i = end;
        }
    }

    /// Runs due timers and sends what every connection that needs it has to send. Nothing
    /// here waits: a connection whose transmit finds the socket full parks it and the others
    /// are served all the same; receiving goes on, and the parked transmits leave first once
    /// the socket has room. Returns the longest hold every connection allows its arrivals.
    fn service(&mut self, now: Instant) -> Duration {
        let mut drained = Vec::new();
        // The core builds as many datagrams as the buffer it is given holds; quinn-udp
        // lowers its GSO limit to 1 if the network device turns GSO down.
        let segments = self.state.max_gso_segments().clamp(1, self.max_burst);
        let mut out = Out {
            socket: self.socket.socket(),
            state: &self.state,
            shared: &self.shared,
            buf: &mut self.send[..crate::connection::send_buffer_len(self.max_datagram, segments)],
            ipv6_socket: self.ipv6_socket,
        };
        // No connection, no hold: the first datagrams of a handshake are taken at once.
        let mut hold = if self.connections.is_empty() {
            Duration::ZERO
        } else {
            MAX_RECEIVE_HOLD
        };
        for entry in self.connections.values_mut() {
            hold = hold.min(entry.hold);
            let marked = entry.link.marked.swap(false, Ordering::AcqRel);
            let due = entry.timeout.is_some_and(|t| t <= now);
            let readers_due = entry.wake_readers_at.is_some_and(|t| t <= now);
            let parked = entry.parked_to.is_some();
            if !(marked || due || readers_due || entry.received || parked) {
                continue;
            }
            entry.received = false;
            // Only this task holds it: no handle is left to use the connection. It closes
            // once what its streams sent last has been delivered, or after `linger`
            // (checked whenever it is serviced: at least every keepalive while the peer is
            // there).
            if Arc::strong_count(&entry.link) == 1 {
                let since = *entry.unheld_since.get_or_insert(now);
                let mut state = entry.link.lock();
                if now >= since + self.linger || state.connection.is_delivered() {
                    let reason = Tunnel::CLOSE_DROPPED_REASON;
                    state.connection.close(now, Tunnel::CLOSE_DROPPED, reason);
                }
            }
            if due {
                entry.link.lock().connection.handle_timeout(now);
            }
            self.write_blocked |= out.transmit(entry, now);
            let mut state = entry.link.lock();
            state.dispatch_events(now);
            entry.timeout = state.connection.poll_timeout();
            entry.wake_readers_at = state.wake_readers_at;
            entry.hold = receive_hold(state.connection.rtt());
            if state.connection.is_drained() {
                drained.push((entry.link.handle, state.connection.path_hint()));
            }
        }
        if !drained.is_empty() {
            let mut core = self.shared.core();
            for (handle, hint) in drained {
                core.endpoint.forget(handle, hint);
                self.connections.remove(&handle);
            }
        }
        hold
    }
}

/// The longest a connection lets its arrivals be held (see [`Moderation`]): a share of its
/// smoothed RTT, at most [`MAX_RECEIVE_HOLD`]; none before an RTT sample or below
/// [`MIN_RECEIVE_HOLD`], where a hold batches little and costs a timer wake-up.
fn receive_hold(rtt: &RttEstimator) -> Duration {
    match rtt.smoothed() / RECEIVE_HOLD_RTT_SHARE {
        hold if !rtt.has_sample() || hold < MIN_RECEIVE_HOLD => Duration::ZERO,
        hold => hold.min(MAX_RECEIVE_HOLD),
    }
}

/// Receive moderation. Paced datagrams arrive one at a time (every 120 µs at 100 Mbit/s),
/// and each would wake the process: an epoll wake-up, a context switch, a round of the I/O
/// task and two receive calls per datagram. While datagrams stream in, the driver stops
/// watching the socket for a *hold* after each receive and then takes what came in the
/// meantime in one batch.
///
/// A receive that found two or more datagrams, or one that followed the last by less than
/// the longest hold, starts a hold; a hold that ends with fewer than two waiting ends the
/// moderation, so the first datagram after a quiet spell (a request) is taken at once. A
/// hold lasts as long as [`RECEIVE_BATCH`] datagrams take to arrive at the rate seen since
/// the last receive, so that the tail of a fast burst (an answer) is not held longer than
/// its arrival needs; and never longer than an eighth of the shortest smoothed RTT among the
/// connections, at most [`MAX_RECEIVE_HOLD`]: no datagram waits longer. No hold is shorter
/// than [`MIN_RECEIVE_HOLD`], and nothing is held without a connection or before every
/// connection has an RTT sample. Pure: times are passed in.
#[derive(Debug, Default)]
struct Moderation {
    /// The longest hold the connections allow; zero holds nothing.
    cap: Duration,
    /// When the last receive that found datagrams was made.
    last: Option<Instant>,
    /// While holding: the socket is not watched for arrivals until then.
    until: Option<Instant>,
    /// The hold is a back-off after receives that kept failing: a connection's cap does
    /// not cut it short.
    backing_off: bool,
}

impl Moderation {
    /// A receive at `now` found `datagrams`.
    fn received(&mut self, now: Instant, datagrams: u64) {
        self.backing_off = false;
        if self.until.is_some_and(|t| t > now) && datagrams <= 1 {
            // Woken during a hold for something else (room to send, a socket error, a
            // report of a datagram that came before the socket was unwatched): the hold
            // goes on, and the pace at its end is counted from here.
            if datagrams == 1 {
                self.last = Some(now);
            }
            return;
        }
        let since = self.last.map(|t| now.saturating_duration_since(t));
        if datagrams > 0 {
            self.last = Some(now);
        }
        // While watching, a second datagram within the longest hold of the first shows a
        // stream; at the end of a hold it takes two, or a straggler after a burst would
        // keep the socket unwatched for another hold.
        let recent = since.is_some_and(|s| s < self.cap);
        let streaming = datagrams >= 2 || (datagrams == 1 && recent && self.until.is_none());
        if !streaming {
            self.until = None;
            return;
        }
        // Arrivals since the last receive came at `since / datagrams` apart; after a quiet
        // spell (two or more found at once) their pace is unknown.
        let hold = match since.filter(|&s| s <= 2 * self.cap) {
            Some(since) => since * RECEIVE_BATCH / u32::try_from(datagrams).unwrap_or(u32::MAX),
            None => self.cap,
        }
        .min(self.cap);
        // A hold too short to be worth a timer wake-up: arrivals that fast fill a batch in
        // the time a wake-up takes.
        self.until = (hold >= MIN_RECEIVE_HOLD).then(|| now + hold);
    }

    /// The longest hold the connections now allow (at `now`); a hold under way is cut to
    /// it, and ends if that is past.
    fn set_cap(&mut self, cap: Duration, now: Instant) {
        self.cap = cap;
        if self.backing_off {
            return;
        }
        if let (Some(until), Some(last)) = (self.until, self.last) {
            let until = until.min(last + cap);
            self.until = (until > now).then_some(until);
        }
    }

    /// Receives keep failing: try again after the longest hold, not at once (whatever
    /// the connections' cap, which the I/O task sets right after).
    fn back_off(&mut self, now: Instant) {
        self.until = Some(now + MAX_RECEIVE_HOLD);
        self.backing_off = true;
    }

    fn is_holding(&self) -> bool {
        self.until.is_some()
    }

    /// Whether a hold has come to its end: time to take what arrived.
    fn is_over(&self, now: Instant) -> bool {
        self.until.is_some_and(|t| t <= now)
    }
}

/// What sending needs of the I/O task, borrowed beside its table of connections.
struct Out<'a> {
    socket: &'a std::net::UdpSocket,
    state: &'a UdpSocketState,
    shared: &'a Shared,
    /// The GSO buffer, as many datagrams long as the device takes in one send.
    buf: &'a mut [u8],
    ipv6_socket: bool,
}

impl Out<'_> {
    /// Sends what `entry`'s connection has: its parked transmit, then up to
    /// [`TRANSMITS_PER_ROUND`] new ones. Returns whether the socket was full (a transmit is
    /// parked).
    fn transmit(&mut self, entry: &mut Entry, now: Instant) -> bool {
        if let Some((destination, shape)) = entry.parked_to {
            let outcome = self.send(destination, &entry.parked, shape);
            if let Some(wait) = outcome.not_sent() {
                return wait;
            }
            self.count(outcome, destination, entry.parked.len(), shape.0);
            entry.parked_to = None;
            entry.parked.clear();
        }
        for _ in 0..TRANSMITS_PER_ROUND {
            let transmit = entry.link.lock().connection.poll_transmit(now, self.buf);
            let Some(t) = transmit else { break };
            let destination = socket::for_socket(t.destination, self.ipv6_socket);
            let contents = &self.buf[..t.size];
            let shape = (t.segment_size, t.dscp);
            let outcome = self.send(destination, contents, shape);
            if let Some(wait) = outcome.not_sent() {
                entry.parked.extend_from_slice(contents);
                entry.parked_to = Some((destination, shape));
                return wait;
            }
            self.count(outcome, destination, t.size, t.segment_size);
        }
        false
    }

    /// Sends `contents`, cut into datagrams of the segment size and marked with the DSCP
    /// of `shape`.
    fn send(
        &self,
        destination: SocketAddr,
        contents: &[u8],
        shape: (Option<usize>, u8),
    ) -> socket::Outcome {
        #[cfg(test)]
        if self.shared.is_blocked(destination) {
            return socket::Outcome::Held;
        }
        socket::try_send(self.socket, self.state, destination, contents, shape)
    }

    fn count(
        &self,
        sent: socket::Outcome,
        destination: SocketAddr,
        size: usize,
        segment_size: Option<usize>,
    ) {
        let stats = &self.shared.stats;
        match sent {
            socket::Outcome::Sent => {
                let segments = segment_size.map_or(1, |s| size.div_ceil(s));
                stats.send_calls.fetch_add(1, Ordering::Relaxed);
                stats
                    .datagrams_sent
                    .fetch_add(segments as u64, Ordering::Relaxed);
            }
            socket::Outcome::Refused(e) => {
                stats.send_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%destination, error = %e, "send refused");
            }
            // Parked, not counted: see `transmit`.
            socket::Outcome::Blocked => {}
            #[cfg(test)]
            socket::Outcome::Held => {}
        }
    }
}

#[cfg(test)]
mod tests;
