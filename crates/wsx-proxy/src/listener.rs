//! The gateway's entry points and the one accept loop they share.
//!
//! ```text
//!  listener ─accept─> client address ─> EntryPoint::admit ─> Admission ─> serve (route, relay)
//!                                                                           │
//!                          the client told the outcome <─ EntryPoint::answer ┘
//! ```
//!
//! Three entry points differ only in what happens before and around the session:
//!
//! - [`Intercepted`]: a transparent listener that the rules hand connections to; the
//!   destination is the accepted socket's local address, the peer the one whose prefix
//!   holds it, and the far side may connect from the client's own address.
//! - [`Forwarding`] (`[[forward]]`): a fixed destination through a named peer.
//! - [`Socks`] (`[[socks]]`): a SOCKS5 handshake names the destination; the client is
//!   answered with the outcome (success and the bound address, network unreachable when
//!   the peer's policy rejects, the reply code of a failed direct connect).

use crate::addrs::{ClientAddr, OrigDstAddr, canonical};
use crate::config::{ForwardConfig, GatewayError, SocksConfig};
use crate::every::Every;
use crate::session::Entry;
use crate::socks;
use crate::sys;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};
use wsx_tunnel::Target;

/// How long a SOCKS client may take over its handshake.
const SOCKS_HANDSHAKE: Duration = Duration::from_secs(10);

/// How long to wait after a failed accept (out of descriptors or memory) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// What differs between the entry points: how a connection names its destination and its
/// peer, and what its client is told of the outcome.
pub(crate) trait EntryPoint: Send + Sync + 'static {
    /// Whatever the client must say before its session starts; `None` drops the
    /// connection (the entry point has logged why, if that is worth a line).
    fn admit(
        &self,
        tcp: &mut TcpStream,
        client: ClientAddr,
    ) -> impl Future<Output = Option<Admission>> + Send;

    /// Tells the client how its connection went, before any data flows. An error means the
    /// client is gone. Entry points whose clients expect no answer keep the default.
    fn answer(
        &self,
        tcp: &mut TcpStream,
        answer: Answer<'_>,
    ) -> impl Future<Output = io::Result<()>> + Send {
        let _ = (tcp, answer);
        async { Ok(()) }
    }
}

/// An admitted connection: where it goes, and how to find its peer.
#[derive(Debug)]
pub(crate) struct Admission {
    pub(crate) destination: Target,
    /// Where the session entered, for the session table and logs.
    pub(crate) entry: Entry,
    pub(crate) peer: PeerSelector,
    /// The client is on a LAN this gateway may speak for: connections to the destination
    /// (the far gateway's, or a bypass from here) are made from the client's own address.
    pub(crate) transparent: bool,
}

/// How a connection's peer is found.
#[derive(Debug)]
pub(crate) enum PeerSelector {
    /// The peer with the longest prefix holding the address.
    Prefix(IpAddr),
    /// The peer configured under the name.
    Named(String),
}

/// What became of an admitted connection.
#[derive(Debug)]
pub(crate) enum Answer<'a> {
    /// Data can flow: through the tunnel (`direct` is `None`; the far gateway connects
    /// while data flows, and a failure there reaches the client as a reset), or over
    /// `direct`, this gateway's own connection to the destination.
    Connected { direct: Option<&'a TcpStream> },
    /// The peer is down and its policy is to reject.
    Rejected,
    /// The direct connection to the destination failed.
    ConnectFailed(&'a io::Error),
}

/// Accepts connections on `listener` until `stop`, each in a task of its own on
/// `sessions`: `entry_point` admits it, then `serve` carries it.
pub(crate) async fn accept<E, S, F>(
    listener: TcpListener,
    entry_point: Arc<E>,
    stop: CancellationToken,
    sessions: TaskTracker,
    serve: S,
) where
    E: EntryPoint,
    S: Fn(Arc<E>, TcpStream, ClientAddr, Admission) -> F + Clone + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    while let Some((mut tcp, client)) = next_connection(&listener, &stop).await {
        let client = ClientAddr(canonical(client));
        let entry_point = entry_point.clone();
        let serve = serve.clone();
        sessions.spawn(async move {
            if let Some(admission) = entry_point.admit(&mut tcp, client).await {
                serve(entry_point, tcp, client, admission).await;
            }
        });
    }
}

/// The next connection on `listener`, or `None` once `stop` is cancelled. Out of
/// descriptors, a waiting connection is refused at once (see [`refuse_one`]) rather than
/// left to hang in the backlog; other failures back off. Warnings say so at most once per
/// 10 s, with the count since.
async fn next_connection(
    listener: &TcpListener,
    stop: &CancellationToken,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok(accepted) => return Some(accepted),
                Err(e) => {
                    let out_of_descriptors =
                        matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
                    let refused = out_of_descriptors && refuse_one(listener);
                    note_accept_failure(&e);
                    if !refused {
                        // Out of memory, or no descriptor even for a refusal: back off
                        // rather than spin.
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                }
            },
            () = stop.cancelled() => return None,
        }
    }
}

/// A descriptor held in reserve for refusing connections when the process has no other:
/// it is closed, one connection accepted and reset with it, and opened again.
static RESERVE: std::sync::Mutex<Option<std::fs::File>> = std::sync::Mutex::new(None);

/// Opens the reserve descriptor, if it is not open (at start-up, and after each refusal).
pub(crate) fn keep_reserve() {
    let mut reserve = RESERVE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if reserve.is_none() {
        *reserve = std::fs::File::open("/dev/null").ok();
    }
}

/// Out of descriptors: frees the reserve, accepts one waiting connection on `listener` and
/// resets it (the client learns at once, instead of waiting in the backlog), and takes the
/// reserve again. Returns whether a connection was refused.
fn refuse_one(listener: &TcpListener) -> bool {
    let mut reserve = RESERVE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if reserve.take().is_none() {
        return false;
    }
    let refused = sys::refuse_waiting(listener);
    *reserve = std::fs::File::open("/dev/null").ok();
    debug!(refused, reserve = reserve.is_some(), "out of descriptors");
    refused
}

/// Accept failures, logged at most once per 10 s with the count since.
static ACCEPT_FAILURES: Every = Every::new(Duration::from_secs(10));

/// Counts a failed accept and warns now and then.
fn note_accept_failure(e: &io::Error) {
    if let Some(failures) = ACCEPT_FAILURES.tick(std::time::Instant::now()) {
        warn!(
            error = %e,
            failures,
            "accepting connections fails (failures since the last warning); when out of \
             descriptors, waiting connections are reset at once: raise the open-file limit \
             (LimitNOFILE) or lower max_sessions"
        );
    }
}

/// The transparent listeners on `port`: IPv4, and IPv6 unless the host has none.
pub(crate) fn bind_transparent(port: u16) -> Result<Vec<TcpListener>, GatewayError> {
    let mut listeners = Vec::new();
    for ip in [
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    ] {
        let addr = SocketAddr::new(ip, port);
        match sys::transparent_listener(addr) {
            Ok(l) => listeners.push(l),
            // A host without IPv6 still serves IPv4.
            Err(e) if ip.is_ipv6() && e.kind() == io::ErrorKind::AddrNotAvailable => {
                warn!(error = %e, "no IPv6: intercepting IPv4 only");
            }
            Err(source) => return Err(GatewayError::Listener { addr, source }),
        }
    }
    Ok(listeners)
}

/// Binds a forwarding or SOCKS5 listener.
pub(crate) async fn bind(addr: SocketAddr) -> Result<TcpListener, GatewayError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| GatewayError::Listener { addr, source })?;
    sys::note_arrivals(socket2::SockRef::from(&listener), addr);
    Ok(listener)
}

/// Connections the rules sent to a transparent listener.
#[derive(Debug)]
pub(crate) struct Intercepted;

impl EntryPoint for Intercepted {
    async fn admit(&self, tcp: &mut TcpStream, _client: ClientAddr) -> Option<Admission> {
        // The original destination: TPROXY never rewrote the packets.
        let destination = OrigDstAddr(canonical(tcp.local_addr().ok()?));
        Some(Admission {
            destination: Target::Addr(destination.0),
            entry: Entry::Intercepted,
            peer: PeerSelector::Prefix(destination.0.ip()),
            transparent: true,
        })
    }
}

/// Connections to a forwarding listener.
#[derive(Debug)]
pub(crate) struct Forwarding(pub(crate) ForwardConfig);

impl EntryPoint for Forwarding {
    async fn admit(&self, _tcp: &mut TcpStream, _client: ClientAddr) -> Option<Admission> {
        Some(Admission {
            destination: self.0.to.clone(),
            entry: Entry::Forward(self.0.name.clone()),
            peer: PeerSelector::Named(self.0.peer.clone()),
            transparent: false,
        })
    }
}

/// Connections to a SOCKS5 listener: the handshake (bounded in time) names the
/// destination, and the client is answered once the outcome is known.
#[derive(Debug)]
pub(crate) struct Socks(pub(crate) SocksConfig);

impl EntryPoint for Socks {
    async fn admit(&self, tcp: &mut TcpStream, client: ClientAddr) -> Option<Admission> {
        let config = &self.0;
        let handshake = socks::handshake(tcp, &config.users);
        let destination = match tokio::time::timeout(SOCKS_HANDSHAKE, handshake).await {
            Ok(Ok(destination)) => destination,
            Ok(Err(e)) => {
                debug!(%client, listener = %config.name, error = %e, "SOCKS handshake failed");
                return None;
            }
            Err(_) => {
                debug!(%client, listener = %config.name, "SOCKS handshake timed out");
                return None;
            }
        };
        Some(Admission {
            destination,
            entry: Entry::Socks(config.name.clone()),
            peer: PeerSelector::Named(config.peer.clone()),
            transparent: false,
        })
    }

    async fn answer(&self, tcp: &mut TcpStream, answer: Answer<'_>) -> io::Result<()> {
        let (code, bound) = match answer {
            // The address the gateway connected from: its own connection's, or through
            // the tunnel the one the client reached.
            Answer::Connected { direct } => {
                let from = direct.unwrap_or(&*tcp);
                (socks::reply::SUCCEEDED, from.local_addr().ok())
            }
            Answer::Rejected => (socks::reply::NETWORK_UNREACHABLE, None),
            Answer::ConnectFailed(e) => (socks::connect_error_reply(e), None),
        };
        socks::send_reply(tcp, code, bound).await
    }
}
