//! Splicing two byte streams (a LAN TCP socket and a tunnel stream, or two TCP sockets when
//! bypassing) with bounded buffers, half-close and reset propagation, byte counts and an
//! idle timeout.
//!
//! - **Backpressure**: each direction has one buffer at a time. When the writing side blocks
//!   (a slow server fills the tunnel stream's window, which fills this gateway's send
//!   buffer), the relay stops reading, the client's TCP window closes, and memory stays
//!   where it was.
//! - **Memory**: each direction keeps a small buffer and borrows one of the configured size
//!   only while data flows ([`crate::buffers`]): an idle session holds 4 KiB of relay
//!   buffers, not twice `relay_buffer` each way.
//! - **Half-close**: the end of one direction (a FIN, a stream finish) is passed on as the
//!   same and the other direction keeps flowing (`tokio::io::copy_bidirectional`).
//! - **Reset**: an error on either side (a client's RST, a stream reset by the far gateway
//!   because the server refused or reset) aborts both: the TCP socket is closed with a RST,
//!   the stream is reset with a code the far side logs. A client never mistakes an
//!   abandoned transfer for a complete one. An end's own reset (many applications close
//!   with a RST) is told apart from a failure: it travels as [`code::RESET`] and both
//!   gateways log it as the session's end, not as an error.
//! - **SMB**: a session whose gateways both run the read-ahead engine is relayed through
//!   its half ([`Engine`], `copy_spliced`): the same ends, resets and counts, the engine
//!   between the reads and the writes.

use crate::buffers::{Buffer, RelayBuffers, SMALL};
use crate::session::{Session, SessionState};
use crate::smb::{Engine, Watch};
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
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
    /// An end (the client, or the server) reset its connection, or closed it with data
    /// still to read: its application's choice, passed on, not a failure of the relay.
    pub const RESET: u64 = 9;

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
            RESET => "reset by an end",
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
    /// An end reset its connection (`by`: "client" or "server"; a reset the far gateway
    /// passed on counts as its end's); both were aborted.
    Reset { by: &'static str },
    /// A side failed otherwise; both were aborted.
    Failed(io::Error),
    /// Nothing moved for the idle timeout; both were aborted.
    Idle,
    /// The gateway stopped; both were aborted.
    Shutdown,
    /// The operator ended the session; both were aborted.
    Killed,
}

/// Where a relay's buffers come from: the gateway's budget, and the size it lends.
#[derive(Debug, Clone)]
pub(crate) struct Buffers {
    pub(crate) from: Arc<RelayBuffers>,
    pub(crate) size: usize,
}

/// Relays between `client` (the side facing the TCP client) and `server` (the side toward
/// the server: a tunnel stream, or a TCP socket when bypassing) until both directions end
/// or something fails; see the module documentation.
pub(crate) async fn relay<C: Side, S: Side>(
    mut client: C,
    mut server: S,
    session: &Session,
    buffers: Buffers,
    idle_timeout: Duration,
    smb: Smb,
    stop: impl std::future::Future<Output = Outcome>,
) -> Outcome {
    let Smb {
        mut watch,
        mut engine,
    } = smb;
    session.set_state(SessionState::Open);
    let outcome = {
        let mut c = Counted {
            inner: &mut client,
            session,
            counters: [&session.from_client, &session.traffic.from_client],
            side: "client",
        };
        let mut s = Counted {
            inner: &mut server,
            session,
            counters: [&session.from_server, &session.traffic.from_server],
            side: "server",
        };
        let copy = async {
            match &mut engine {
                None => copy_both(&mut c, &mut s, &buffers, &mut watch).await,
                Some(e) if e.end_is_client => {
                    copy_spliced(&mut c, &mut s, e, &buffers, &mut watch).await
                }
                Some(e) => copy_spliced(&mut s, &mut c, e, &buffers, &mut watch).await,
            }
        };
        tokio::select! {
            result = copy => match result {
                Ok(_) => Outcome::Complete,
                Err(e) => classify(e),
            },
            () = idle(session, idle_timeout) => Outcome::Idle,
            outcome = stop => outcome,
        }
    };
    let code = match &outcome {
        Outcome::Complete => return outcome,
        Outcome::Reset { .. } => code::RESET,
        Outcome::Failed(_) | Outcome::Killed => code::ABORTED,
        Outcome::Idle => code::IDLE,
        Outcome::Shutdown => code::SHUTDOWN,
    };
    client.abort(code);
    server.abort(code);
    outcome
}

/// What a relay of an SMB session does besides copying.
#[derive(Debug, Default)]
pub(crate) struct Smb {
    /// Judges and counts the session.
    pub(crate) watch: Option<Watch>,
    /// The engine half the relay runs the session through.
    pub(crate) engine: Option<Engine>,
}

/// Bytes waiting to be written to one side beyond which the side that feeds them is not
/// read: the spliced relay's backpressure.
const SPLICE_LIMIT: usize = 1 << 20;

/// [`copy_both`] through an engine half: `end` is the session's TCP end (its client at
/// near, its server at far), `peer` the stream to the other gateway. Each side is read while
/// what it feeds waits below [`SPLICE_LIMIT`]; a side's end is passed on once what it fed
/// was written. `watch` sees the end's bytes both ways.
async fn copy_spliced<E, P>(
    end: &mut E,
    peer: &mut P,
    engine: &mut Engine,
    buffers: &Buffers,
    watch: &mut Option<Watch>,
) -> io::Result<()>
where
    E: AsyncRead + AsyncWrite + Unpin,
    P: AsyncRead + AsyncWrite + Unpin,
{
    let (mut at_end, mut at_peer) = (Way::default(), Way::default());
    // The end's bytes travel toward the server at near (its end is the client).
    let from_client = engine.end_is_client;
    let invalid = |e: wsx_smb::engine::SpliceError| io::Error::new(io::ErrorKind::InvalidData, e);
    // Wakes the relay when near's next held answer outlives its window, bytes or not.
    let mut expiry: Option<Pin<Box<tokio::time::Sleep>>> = None;
    poll_fn(|cx| {
        loop {
            let mut progress = false;
            let splice = &mut engine.splice;
            // Near gives answers held with a validity window only within it.
            splice.set_now(std::time::Instant::now());
            while !splice.to_end().is_empty() {
                let Poll::Ready(n) = Pin::new(&mut *end).poll_write(cx, splice.to_end())? else {
                    break;
                };
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                if let Some(watch) = watch.as_mut() {
                    watch.read(!from_client, &splice.to_end()[..n]);
                }
                splice.end_written(n);
                (at_end.unflushed, progress) = (true, true);
            }
            while !splice.to_peer().is_empty() {
                let Poll::Ready(n) = Pin::new(&mut *peer).poll_write(cx, splice.to_peer())? else {
                    break;
                };
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                splice.peer_written(n);
                (at_peer.unflushed, progress) = (true, true);
            }
            // A side whose source ended, all it fed written, is ended in turn.
            if at_peer.read_done
                && splice.to_end().is_empty()
                && splice.held_for_end() == 0
                && !at_end.shut
            {
                progress |= at_end.poll_shut(cx, &mut *end)?;
            }
            if at_end.read_done
                && splice.to_peer().is_empty()
                && splice.held_for_peer() == 0
                && !at_peer.shut
            {
                progress |= at_peer.poll_shut(cx, &mut *peer)?;
            }
            // What the engine has for a side already shut (near's CONSUMED after the
            // client's end, say) has nowhere to go.
            if at_end.shut {
                splice.end_written(splice.to_end().len());
            }
            if at_peer.shut {
                splice.peer_written(splice.to_peer().len());
            }
            // Far's window is leased just before what it reads is handed to it (after the
            // read took its buffer from the same budget), and settled in `count`.
            if !at_end.read_done
                && engine.splice.to_peer().len() + engine.splice.held_for_peer() < SPLICE_LIMIT
            {
                if let Poll::Ready(data) = at_end.poll_read(cx, &mut *end, buffers)? {
                    progress = true;
                    if data.is_empty() {
                        at_end.read_done = true;
                        engine.splice.end_finished();
                    } else {
                        if let Some(watch) = watch.as_mut() {
                            watch.read(from_client, data);
                        }
                        engine.lease();
                        engine.splice.from_end(data).map_err(invalid)?;
                    }
                }
            }
            if !at_peer.read_done
                && engine.splice.to_end().len() + engine.splice.held_for_end() < SPLICE_LIMIT
            {
                if let Poll::Ready(data) = at_peer.poll_read(cx, &mut *peer, buffers)? {
                    progress = true;
                    if data.is_empty() {
                        at_peer.read_done = true;
                        engine.splice.peer_finished().map_err(invalid)?;
                    } else {
                        engine.lease();
                        engine.splice.from_peer(data).map_err(invalid)?;
                    }
                }
            }
            engine.count();
            if at_end.shut && at_peer.shut {
                return Poll::Ready(Ok(()));
            }
            if !progress {
                if let Some(deadline) = engine.splice.next_deadline() {
                    // A millisecond late, so that the clock read at the top is past it.
                    let deadline = tokio::time::Instant::from_std(deadline)
                        + std::time::Duration::from_millis(1);
                    let sleep =
                        expiry.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                    if sleep.deadline() != deadline {
                        sleep.as_mut().reset(deadline);
                    }
                    if sleep.as_mut().poll(cx).is_ready() {
                        continue;
                    }
                }
                at_end.poll_flushed(cx, &mut *end)?;
                at_peer.poll_flushed(cx, &mut *peer)?;
                return Poll::Pending;
            }
        }
    })
    .await
}

/// One side of a spliced relay: its read buffer, borrowed while data flows, and its state.
struct Way {
    small: [u8; SMALL],
    large: Option<Buffer>,
    read_done: bool,
    /// Shut down for writing, the other side's end passed on.
    shut: bool,
    unflushed: bool,
}

impl Default for Way {
    fn default() -> Self {
        Self {
            small: [0; SMALL],
            large: None,
            read_done: false,
            shut: false,
            unflushed: false,
        }
    }
}

impl Way {
    /// Reads what `r` has (empty at its end); a read that fills the small buffer borrows a
    /// large one for the next, and it goes back once nothing is ready.
    fn poll_read<R: AsyncRead + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        r: &mut R,
        buffers: &Buffers,
    ) -> Poll<io::Result<&[u8]>> {
        let buffer: &mut [u8] = match &mut self.large {
            Some(large) => large,
            None => &mut self.small,
        };
        let mut read = ReadBuf::new(buffer);
        match Pin::new(r).poll_read(cx, &mut read) {
            Poll::Ready(Ok(())) => {
                let n = read.filled().len();
                if n == SMALL && self.large.is_none() && buffers.size > SMALL {
                    self.large = buffers.from.take(buffers.size);
                    // What was read is in the small buffer still.
                    return Poll::Ready(Ok(&self.small[..n]));
                }
                match &self.large {
                    Some(large) => Poll::Ready(Ok(&large[..n])),
                    None => Poll::Ready(Ok(&self.small[..n])),
                }
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                self.large = None;
                Poll::Pending
            }
        }
    }

    /// Flushes and shuts down `w`; whether that completed.
    fn poll_shut<W: AsyncWrite + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        w: &mut W,
    ) -> io::Result<bool> {
        if let Poll::Ready(r) = Pin::new(&mut *w).poll_flush(cx) {
            r?;
            self.unflushed = false;
            if let Poll::Ready(r) = Pin::new(w).poll_shutdown(cx) {
                r?;
                self.shut = true;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Flushes what was written since the last flush, if anything was.
    fn poll_flushed<W: AsyncWrite + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        w: &mut W,
    ) -> io::Result<()> {
        if self.unflushed
            && let Poll::Ready(r) = Pin::new(w).poll_flush(cx)
        {
            r?;
            self.unflushed = false;
        }
        Ok(())
    }
}

/// Copies both ways until both directions ended (each end passed on as a shutdown), or one
/// failed. `watch` sees every byte read, `a`'s as travelling toward the server.
async fn copy_both<A, B>(
    a: &mut A,
    b: &mut B,
    buffers: &Buffers,
    watch: &mut Option<Watch>,
) -> io::Result<()>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let mut a_to_b = Direction::new(buffers, true);
    let mut b_to_a = Direction::new(buffers, false);
    poll_fn(|cx| {
        let there = a_to_b.poll(cx, a, b, watch.as_mut())?;
        let back = b_to_a.poll(cx, b, a, watch.as_mut())?;
        if there.is_ready() && back.is_ready() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    })
    .await
}

/// One direction of a relay: read into a buffer, write it all, again, until the end.
struct Direction<'a> {
    buffers: &'a Buffers,
    small: [u8; SMALL],
    /// Borrowed while data flows.
    large: Option<Buffer>,
    /// The bytes `at..len` of the buffer they were read into wait to be written.
    at: usize,
    len: usize,
    in_large: bool,
    /// The reader reached its end; the writer was shut down.
    read_done: bool,
    done: bool,
    /// Written since the last flush.
    unflushed: bool,
    /// From the client's side toward the server's (for a watch).
    to_server: bool,
}

impl<'a> Direction<'a> {
    fn new(buffers: &'a Buffers, to_server: bool) -> Self {
        Self {
            to_server,
            buffers,
            small: [0; SMALL],
            large: None,
            at: 0,
            len: 0,
            in_large: false,
            read_done: false,
            done: false,
            unflushed: false,
        }
    }

    /// The bytes read and not yet written.
    fn pending(&self) -> &[u8] {
        match &self.large {
            Some(large) if self.in_large => &large[self.at..self.len],
            _ => &self.small[self.at..self.len],
        }
    }

    /// The buffer to read into: the large one while it is held.
    fn buffer(&mut self) -> &mut [u8] {
        self.in_large = self.large.is_some();
        match &mut self.large {
            Some(large) => large,
            None => &mut self.small,
        }
    }

    fn poll<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        r: &mut R,
        w: &mut W,
        mut watch: Option<&mut Watch>,
    ) -> Poll<io::Result<()>>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        if self.done {
            return Poll::Ready(Ok(()));
        }
        loop {
            if self.at == self.len && !self.read_done {
                let mut read = ReadBuf::new(self.buffer());
                match Pin::new(&mut *r).poll_read(cx, &mut read) {
                    Poll::Ready(Ok(())) => {
                        let n = read.filled().len();
                        let full = n == read.capacity();
                        (self.at, self.len) = (0, n);
                        if n == 0 {
                            self.read_done = true;
                        } else if full && self.large.is_none() && self.buffers.size > SMALL {
                            // Data flows: borrow room (if the budget has it), move what the
                            // small buffer holds there and fill the rest, so that this turn
                            // still ends in one write.
                            self.large = self.buffers.from.take(self.buffers.size);
                            if let Some(large) = &mut self.large {
                                large[..n].copy_from_slice(&self.small[..n]);
                                self.in_large = true;
                                let mut more = ReadBuf::new(&mut large[n..]);
                                match Pin::new(&mut *r).poll_read(cx, &mut more) {
                                    Poll::Ready(Ok(())) if more.filled().is_empty() => {
                                        self.read_done = true;
                                    }
                                    Poll::Ready(Ok(())) => self.len += more.filled().len(),
                                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                                    Poll::Pending => {}
                                }
                            }
                        }
                        if let Some(watch) = watch.as_deref_mut() {
                            watch.read(self.to_server, self.pending());
                        }
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => {
                        // Nothing waits: the large buffer goes back until data flows again.
                        self.large = None;
                        if self.unflushed {
                            ready!(Pin::new(&mut *w).poll_flush(cx))?;
                            self.unflushed = false;
                        }
                        return Poll::Pending;
                    }
                }
            }
            while self.at < self.len {
                let data = self.pending();
                let n = ready!(Pin::new(&mut *w).poll_write(cx, data))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.at += n;
                self.unflushed = true;
            }
            if self.read_done {
                ready!(Pin::new(&mut *w).poll_flush(cx))?;
                ready!(Pin::new(&mut *w).poll_shutdown(cx))?;
                self.done = true;
                self.large = None;
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// An error of one side of a relay, with the side's name.
#[derive(Debug, thiserror::Error)]
#[error("{side}: {source}")]
struct SideError {
    side: &'static str,
    source: io::Error,
}

/// How a relay that failed with `e` ended: an end's reset, or a failure.
fn classify(e: io::Error) -> Outcome {
    let Some(SideError { side, source }) = e.get_ref().and_then(|i| i.downcast_ref()) else {
        return Outcome::Failed(e);
    };
    if reset_by_end(source) {
        Outcome::Reset { by: side }
    } else {
        Outcome::Failed(e)
    }
}

/// Whether `e` says that an end reset its connection: a TCP socket's reset or broken pipe
/// (the peer closed with data unread, or aborted), or a stream the far gateway reset because
/// its own end did ([`code::RESET`]). Any other stream reset is the far relay's failure.
fn reset_by_end(e: &io::Error) -> bool {
    match e
        .get_ref()
        .and_then(|i| i.downcast_ref::<wsx_tunnel::StreamError>())
    {
        Some(wsx_tunnel::StreamError::Reset(c)) => *c == code::RESET,
        Some(_) => false,
        None => matches!(
            e.kind(),
            io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
        ),
    }
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
    /// "client" or "server", for the errors it passes on.
    side: &'static str,
}

impl<T> Counted<'_, T> {
    /// `result`, its error tagged with this side.
    fn tag<R>(&self, result: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        result.map_err(|source| {
            let kind = source.kind();
            let side = self.side;
            io::Error::new(kind, SideError { side, source })
        })
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<'_, T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut *self.inner).poll_read(cx, buf);
        let result = self.tag(result);
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
        let result = Pin::new(&mut *self.inner).poll_write(cx, data);
        self.tag(result)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut *self.inner).poll_flush(cx);
        self.tag(result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut *self.inner).poll_shutdown(cx);
        self.tag(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addrs::ClientAddr;
    use crate::session::{Entry, Route, Sessions};
    use std::sync::Arc;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;
    use tokio_util::sync::CancellationToken;
    use wsx_tunnel::{StreamError, Target};

    fn side_error(side: &'static str, source: io::Error) -> io::Error {
        io::Error::new(source.kind(), SideError { side, source })
    }

    #[test]
    fn an_end_s_reset_is_told_from_a_failure() {
        let tcp_reset = io::Error::from(io::ErrorKind::ConnectionReset);
        assert!(matches!(
            classify(side_error("server", tcp_reset)),
            Outcome::Reset { by: "server" }
        ));
        let pipe = io::Error::from(io::ErrorKind::BrokenPipe);
        assert!(matches!(
            classify(side_error("client", pipe)),
            Outcome::Reset { by: "client" }
        ));
        // The far gateway passed its end's reset on; or its relay failed.
        let stream =
            |code| io::Error::new(io::ErrorKind::ConnectionReset, StreamError::Reset(code));
        assert!(matches!(
            classify(side_error("server", stream(code::RESET))),
            Outcome::Reset { by: "server" }
        ));
        assert!(matches!(
            classify(side_error("server", stream(code::ABORTED))),
            Outcome::Failed(_)
        ));
        let other = io::Error::new(io::ErrorKind::InvalidData, "bad chunk");
        assert!(matches!(
            classify(side_error("server", other)),
            Outcome::Failed(_)
        ));
    }

    /// Data flows through a borrowed buffer, which goes back once nothing waits; with the
    /// budget spent, the small buffers carry every byte just the same.
    #[tokio::test]
    async fn buffers_are_borrowed_while_data_flows_and_given_back() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // A budget, none, and a configured buffer smaller than the small one (never borrowed).
        for (budget, size) in [(1 << 20, 64 * 1024), (0, 64 * 1024), (1 << 20, 1024)] {
            let from = RelayBuffers::new(budget);
            let buffers = Buffers {
                from: from.clone(),
                size,
            };
            let (mut app_client, mut client_side) = pair().await;
            let (mut server_side, mut app_server) = pair().await;
            let relay = tokio::spawn(async move {
                copy_both(&mut client_side, &mut server_side, &buffers, &mut None).await
            });
            let data: Vec<u8> = (0..4_000_000u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect();
            let sent = data.clone();
            let writer =
                tokio::spawn(async move { app_client.write_all(&sent).await.map(|()| app_client) });
            let mut got = vec![0; data.len()];
            let read = app_server.read_exact(&mut got).await;
            assert!(read.is_ok(), "{read:?}");
            assert!(got == data, "the bytes arrived as sent");
            let mut app_client = writer
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|e| panic!("{e}"));
            let deadline = Instant::now() + Duration::from_secs(5);
            while from.lent() > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(from.lent(), 0, "an idle relay holds no large buffer");
            if budget == 0 {
                assert!(from.refused() > 0, "the spent budget was asked and refused");
            } else {
                assert_eq!(from.refused(), 0);
            }
            // Both ends close: the relay passes each end on and completes.
            let closed = app_client.shutdown().await;
            assert!(closed.is_ok());
            let mut rest = Vec::new();
            let end = app_server.read_to_end(&mut rest).await;
            assert!(matches!(end, Ok(0)), "{end:?}");
            assert!(app_server.shutdown().await.is_ok());
            let copied = relay.await.unwrap_or_else(|e| panic!("{e}"));
            assert!(copied.is_ok(), "{copied:?}");
        }
    }

    /// A session's watch reads every byte the relay copies, once and in order, whichever
    /// buffers carry them: a real SMB session (smbclient against Samba, recorded) relayed
    /// both ways at once is judged unsigned, and an SMB1 message after its last response is
    /// seen as such. A byte skipped or seen twice anywhere before would put the watch out of
    /// step with the framing, and the last message would read as something else, or not at
    /// all.
    #[tokio::test]
    async fn a_watch_reads_every_byte_once_in_order() {
        use crate::smb::{SmbTotals, Watch};
        let captures = concat!(env!("CARGO_MANIFEST_DIR"), "/../wsx-smb/tests/captures/");
        let read = |name: &str| {
            std::fs::read(format!("{captures}{name}")).unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let requests = read("guest21.to_server");
        let mut responses = read("guest21.to_client");
        responses.extend_from_slice(&[0, 0, 0, 40, 0xff, b'S', b'M', b'B']);
        responses.resize(responses.len() + 36, 0);
        for (budget, size) in [(1 << 20, 64 * 1024), (0, 64 * 1024), (1 << 20, 1024)] {
            let buffers = Buffers {
                from: RelayBuffers::new(budget),
                size,
            };
            let totals = Arc::new(SmbTotals::default());
            let mut watch = Some(Watch::new(totals.clone()));
            let (app_client, mut client_side) = pair().await;
            let (mut server_side, app_server) = pair().await;
            let relay = tokio::spawn(async move {
                copy_both(&mut client_side, &mut server_side, &buffers, &mut watch).await
            });
            let exchanged = exchange(app_client, app_server, &requests, &responses, None);
            let (up, down) = exchanged.await;
            assert!(up == requests && down == responses, "relayed as sent");
            let copied = relay.await.unwrap_or_else(|e| panic!("{e}"));
            assert!(copied.is_ok(), "{copied:?}");
            let stats = totals.snapshot();
            assert_eq!(
                (stats.sessions, stats.unsigned),
                (1, 1),
                "{size}: {stats:?}"
            );
            let passed: Vec<_> = stats
                .passed_through
                .iter()
                .filter(|(_, n)| *n > 0)
                .collect();
            assert_eq!(passed, vec![&("smb1", 1)], "{size}: {stats:?}");
        }
    }

    /// A real SMB session (smbclient against Samba, recorded) through both engine halves,
    /// each driven by `copy_spliced` as the gateways run them, the tunnel stream between
    /// them a TCP pair: every byte arrives as sent both ways, each end's close is passed on
    /// after what came before it (far's requests waiting for credits included), both
    /// relays complete, and the engines give back every byte they held, far its lease of
    /// the relay budget too. Far has a window but reads nothing ahead (smbclient's opens
    /// let others write), so the server sees exactly the client's requests.
    #[tokio::test]
    async fn a_session_crosses_both_engine_halves_byte_for_byte() {
        use crate::smb::{Engine, SmbTotals};
        let captures = concat!(env!("CARGO_MANIFEST_DIR"), "/../wsx-smb/tests/captures/");
        let read = |name: &str| {
            std::fs::read(format!("{captures}{name}")).unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let (requests, responses) = (read("guest21.to_server"), read("guest21.to_client"));
        for size in [64 * 1024, 1024] {
            let buffers = Buffers {
                from: RelayBuffers::new(1 << 20),
                size,
            };
            let totals = Arc::new(SmbTotals::default());
            let (app_client, mut client_side) = pair().await;
            let (mut near_peer, mut far_peer) = pair().await;
            let (mut server_side, app_server) = pair().await;
            let (near_buffers, near_totals) = (buffers.clone(), totals.clone());
            let near = tokio::spawn(async move {
                let mut engine = Engine::near(near_totals);
                let copied = copy_spliced(
                    &mut client_side,
                    &mut near_peer,
                    &mut engine,
                    &near_buffers,
                    &mut None,
                )
                .await;
                drop(engine);
                copied
            });
            let (far_totals, pool) = (totals.clone(), buffers.from.clone());
            let far = tokio::spawn(async move {
                let mut engine = Engine::far(8 << 20, far_totals, buffers.from.clone());
                let copied = copy_spliced(
                    &mut server_side,
                    &mut far_peer,
                    &mut engine,
                    &buffers,
                    &mut None,
                )
                .await;
                drop(engine);
                copied
            });
            // The client sends all its requests at once and closes; far sends on only
            // what the server's credits allow (the recorded client sent each within its
            // credits) and holds the rest, and with it the close, until the server's
            // answers bring the credits.
            let answer_after = Some(Duration::from_millis(100));
            let exchanged = exchange(app_client, app_server, &requests, &responses, answer_after);
            let (up, down) = exchanged.await;
            assert!(up == requests, "the server got the client's bytes");
            assert!(down == responses, "the client got the server's bytes");
            for relay in [near, far] {
                let copied = relay.await.unwrap_or_else(|e| panic!("{e}"));
                assert!(copied.is_ok(), "{copied:?}");
            }
            let stats = totals.snapshot();
            assert_eq!(stats.engine_sessions, 2);
            assert_eq!(stats.held_bytes, 0, "{stats:?}");
            assert_eq!(pool.lent(), 0, "every byte leased came back");
        }
    }

    /// An answer near holds with a validity window and nobody asks for is dropped when the
    /// window ends, with no byte from either side to wake the relay: far is told
    /// (DROPPED) and near's memory comes back.
    #[tokio::test]
    async fn a_held_answer_nobody_asks_for_is_dropped_when_its_window_ends() {
        use crate::smb::{Engine, SmbTotals};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        use wsx_smb::engine::link::NO_CLOCK;
        use wsx_smb::engine::{Key, ReadKey, Record};
        use wsx_smb::wire::messages::ReadRequest;
        let buffers = Buffers {
            from: RelayBuffers::new(1 << 20),
            size: 64 * 1024,
        };
        let totals = Arc::new(SmbTotals::default());
        let (_app_client, mut client_side) = pair().await;
        let (mut near_peer, mut far_end) = pair().await;
        let near_totals = totals.clone();
        let near = tokio::spawn(async move {
            let mut engine = Engine::near(near_totals);
            copy_spliced(
                &mut client_side,
                &mut near_peer,
                &mut engine,
                &buffers,
                &mut None,
            )
            .await
        });
        let h = wsx_smb::sim::header(wsx_smb::wire::header::Command::READ, 9, 1, 1);
        let read: ReadRequest = wsx_smb::sim::read_at(0, 65536);
        let mut records = Vec::new();
        Record::Announce {
            message_id: 9,
            key: Key::Read(ReadKey::of(&h, &read)),
            valid_ms: 1000,
        }
        .emit(&mut records)
        .unwrap_or_else(|e| panic!("{e}"));
        Record::Prefetched {
            message_id: 9,
            at: NO_CLOCK,
            answer: vec![0xab; 5000],
        }
        .emit(&mut records)
        .unwrap_or_else(|e| panic!("{e}"));
        far_end
            .write_all(&records)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(totals.snapshot().held_bytes >= 5000, "held while valid");
        let mut dropped = Vec::new();
        Record::Dropped { message_id: 9 }
            .emit(&mut dropped)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut got = vec![0; dropped.len()];
        tokio::time::timeout(Duration::from_secs(10), far_end.read_exact(&mut got))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, dropped);
        // Counted as expired in the gateway's totals (the step that wrote the record
        // counts right after).
        let counted = async {
            while totals.snapshot().expired == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(2), counted)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(totals.snapshot().expired, 1);
        // The answer's 5,000 bytes are gone; the splice keeps a little room of its own.
        let held = totals.snapshot().held_bytes;
        assert!(held < 1024, "{held}");
        near.abort();
    }

    /// Plays a recorded session's two ends: the client sends `requests` and closes, the
    /// server (after `answer_after`) sends `responses` and closes; what each read.
    async fn exchange(
        mut app_client: TcpStream,
        mut app_server: TcpStream,
        requests: &[u8],
        responses: &[u8],
        answer_after: Option<Duration>,
    ) -> (Vec<u8>, Vec<u8>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let sent_up = requests.to_vec();
        let client = tokio::spawn(async move {
            app_client.write_all(&sent_up).await?;
            app_client.shutdown().await?;
            let mut got = Vec::new();
            app_client.read_to_end(&mut got).await.map(|_| got)
        });
        if let Some(delay) = answer_after {
            tokio::time::sleep(delay).await;
        }
        app_server
            .write_all(responses)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        app_server
            .shutdown()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut up = Vec::new();
        app_server
            .read_to_end(&mut up)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let down = client
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"));
        (up, down)
    }

    /// A connected pair of loopback TCP sockets.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let (a, b) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (
            a.unwrap_or_else(|e| panic!("{e}")),
            b.unwrap_or_else(|e| panic!("{e}")).0,
        )
    }

    /// A server that closes with a reset (as many do when they close with unread data):
    /// the relay ends as the server's reset, and the client sees a reset too.
    #[tokio::test]
    async fn a_server_s_reset_ends_the_session_as_a_reset() {
        let (mut app_client, client_side) = pair().await;
        let (server_side, app_server) = pair().await;
        let sessions = Arc::new(Sessions::default());
        let guard = sessions.register(
            Instant::now(),
            ClientAddr("127.0.0.1:1".parse().unwrap_or_else(|e| panic!("{e}"))),
            (
                Target::Name {
                    host: "test".into(),
                    port: 1,
                },
                Entry::Intercepted,
            ),
            None,
            Route::Bypass,
            CancellationToken::new(),
        );
        let relayed = tokio::spawn(async move {
            let idle = Duration::from_secs(30);
            relay(
                client_side,
                server_side,
                &guard,
                Buffers {
                    from: RelayBuffers::new(1 << 20),
                    size: 4096,
                },
                idle,
                Smb::default(),
                std::future::pending(),
            )
            .await
        });
        app_client
            .write_all(b"hello")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        crate::sys::abort(app_server);
        let outcome = relayed.await.unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(outcome, Outcome::Reset { by: "server" }),
            "{outcome:?}"
        );
        let mut rest = Vec::new();
        let read = tokio::io::AsyncReadExt::read_to_end(&mut app_client, &mut rest).await;
        assert!(read.is_err_and(|e| e.kind() == io::ErrorKind::ConnectionReset));
    }
}
