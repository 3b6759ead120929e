//! Splicing two byte streams (a LAN TCP socket and a tunnel stream, or two TCP sockets when
//! bypassing) with bounded buffers, half-close and reset propagation, byte counts and an
//! idle timeout.
//!
//! - **Backpressure**: each direction has one buffer of the configured size. When the
//!   writing side blocks (a slow server fills the tunnel stream's window, which fills this
//!   gateway's send buffer), the relay stops reading, the client's TCP window closes, and
//!   memory stays where it was.
//! - **Half-close**: the end of one direction (a FIN, a stream finish) is passed on as the
//!   same and the other direction keeps flowing (`tokio::io::copy_bidirectional`).
//! - **Reset**: an error on either side (a client's RST, a stream reset by the far gateway
//!   because the server refused or reset) aborts both: the TCP socket is closed with a RST,
//!   the stream is reset with a code the far side logs. A client never mistakes an
//!   abandoned transfer for a complete one.

use crate::session::{Session, SessionState};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use wsx_tunnel::driver::Stream;

/// Stream reset codes: why the far gateway gave up on a stream, or why this one did.
pub mod code {
    /// The stream's handle was dropped without an end
    /// ([`Stream::RESET_DROPPED`](wsx_tunnel::driver::Stream::RESET_DROPPED)).
    pub const DROPPED: u64 = wsx_tunnel::driver::Stream::RESET_DROPPED;
    /// The server refused the connection.
    pub const REFUSED: u64 = 1;
    /// The server's host or network was unreachable.
    pub const UNREACHABLE: u64 = 2;
    /// Connecting to the server timed out.
    pub const TIMED_OUT: u64 = 3;
    /// Connecting failed for another reason.
    pub const CONNECT_FAILED: u64 = 4;
    /// A side of the relay failed or reset.
    pub const ABORTED: u64 = 5;
    /// Nothing moved for the idle timeout.
    pub const IDLE: u64 = 6;
    /// The gateway stopped before the session ended.
    pub const SHUTDOWN: u64 = 7;
    /// The stream carried no destination, or the gateway accepts no more sessions.
    pub const REJECTED: u64 = 8;

    /// A short name for logs.
    pub fn describe(code: u64) -> &'static str {
        match code {
            DROPPED => "dropped",
            REFUSED => "connection refused",
            UNREACHABLE => "unreachable",
            TIMED_OUT => "connect timed out",
            CONNECT_FAILED => "connect failed",
            ABORTED => "aborted",
            IDLE => "idle timeout",
            SHUTDOWN => "gateway shutdown",
            REJECTED => "rejected",
            _ => "unknown",
        }
    }
}

/// The reset code for a failed connect.
pub(crate) fn connect_error_code(e: &io::Error) -> u64 {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => code::REFUSED,
        io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => code::UNREACHABLE,
        io::ErrorKind::TimedOut => code::TIMED_OUT,
        _ => code::CONNECT_FAILED,
    }
}

/// One side of a relay: something that can be read, written, and abandoned.
pub(crate) trait Side: AsyncRead + AsyncWrite + Unpin {
    /// Ends the connection abnormally: the other end must see a failure, not an end.
    fn abort(self, code: u64);
}

impl Side for TcpStream {
    fn abort(self, _code: u64) {
        crate::sys::abort(self);
    }
}

impl Side for Stream {
    fn abort(mut self, code: u64) {
        self.reset(code);
    }
}

/// How a relay ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Both directions ended normally.
    Complete,
    /// A side failed; both were aborted.
    Failed(io::Error),
    /// Nothing moved for the idle timeout; both were aborted.
    Idle,
    /// The gateway stopped; both were aborted.
    Shutdown,
    /// The operator ended the session; both were aborted.
    Killed,
}

/// Relays between `client` (the side facing the TCP client) and `server` (the side toward
/// the server: a tunnel stream, or a TCP socket when bypassing) until both directions end
/// or something fails; see the module documentation.
pub(crate) async fn relay<C: Side, S: Side>(
    mut client: C,
    mut server: S,
    session: &Session,
    buffer: usize,
    idle_timeout: Duration,
    stop: impl std::future::Future<Output = Outcome>,
) -> Outcome {
    session.set_state(SessionState::Open);
    let outcome = {
        let mut c = Counted {
            inner: &mut client,
            session,
            counters: [&session.from_client, &session.traffic.from_client],
        };
        let mut s = Counted {
            inner: &mut server,
            session,
            counters: [&session.from_server, &session.traffic.from_server],
        };
        let copy = tokio::io::copy_bidirectional_with_sizes(&mut c, &mut s, buffer, buffer);
        tokio::select! {
            result = copy => match result {
                Ok(_) => Outcome::Complete,
                Err(e) => Outcome::Failed(e),
            },
            () = idle(session, idle_timeout) => Outcome::Idle,
            outcome = stop => outcome,
        }
    };
    let code = match &outcome {
        Outcome::Complete => return outcome,
        Outcome::Failed(_) | Outcome::Killed => code::ABORTED,
        Outcome::Idle => code::IDLE,
        Outcome::Shutdown => code::SHUTDOWN,
    };
    client.abort(code);
    server.abort(code);
    outcome
}

/// Completes once the session has been idle for `timeout`.
async fn idle(session: &Session, timeout: Duration) {
    loop {
        let idle = session.idle_for(Instant::now());
        if idle >= timeout {
            return;
        }
        tokio::time::sleep(timeout - idle).await;
    }
}

/// A side whose reads are counted into the session and the gateway's totals.
struct Counted<'a, T> {
    inner: &'a mut T,
    session: &'a Session,
    counters: [&'a AtomicU64; 2],
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<'_, T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut *self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            for counter in self.counters {
                counter.fetch_add(n as u64, Ordering::Relaxed);
            }
            self.session.touch(Instant::now());
        } else if matches!(result, Poll::Ready(Ok(()))) {
            // One direction reached its end.
            self.session.set_state(SessionState::HalfClosed);
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<'_, T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_shutdown(cx)
    }
}
