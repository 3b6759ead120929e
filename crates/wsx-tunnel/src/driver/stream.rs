//! A stream as tokio's `AsyncRead` + `AsyncWrite`, so a proxy can splice it to a TCP socket
//! with `tokio::io::copy_bidirectional`.

use super::{Link, LinkState, StreamSlot, register_once};
use crate::streams::StreamError;
use crate::wire::{StreamId, StreamMeta};
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// One stream of a [`Tunnel`](super::Tunnel), both directions.
///
/// `poll_shutdown` finishes the sending direction (a TCP FIN); reading returns 0 bytes at
/// the peer's finish. Dropping a stream before both directions ended resets it with
/// [`Stream::RESET_DROPPED`], since nobody is left to read or write the rest. A stream is a
/// handle to its connection too: see [`Tunnel`](super::Tunnel) for when a connection closes.
#[derive(Debug)]
pub struct Stream {
    link: Arc<Link>,
    id: StreamId,
    meta: StreamMeta,
    finished: bool,
    eof: bool,
}

impl Stream {
    /// The reset code of a stream dropped before it ended.
    pub const RESET_DROPPED: u64 = 0;

    /// A handle for stream `id` of `link`, whose state the caller has locked.
    pub(super) fn new(
        link: Arc<Link>,
        state: &mut LinkState,
        id: StreamId,
        meta: StreamMeta,
    ) -> Self {
        state.streams.insert(id, StreamSlot::default());
        Self {
            link,
            id,
            meta,
            finished: false,
            eof: false,
        }
    }

    pub fn id(&self) -> StreamId {
        self.id
    }

    /// The addresses, scenario and hint the stream was opened with.
    pub fn meta(&self) -> &StreamMeta {
        &self.meta
    }

    /// Holds at most `limit` bytes written and not yet sent; see
    /// [`Connection::set_unsent_limit`](crate::Connection::set_unsent_limit).
    pub fn set_unsent_limit(&self, limit: u64) {
        self.link.lock().connection.set_unsent_limit(self.id, limit);
    }

    /// Marks the tunnel packets that carry this stream's data with `dscp`; see
    /// [`Connection::set_dscp`](crate::Connection::set_dscp).
    pub fn set_dscp(&self, dscp: u8) {
        self.link.lock().connection.set_dscp(self.id, dscp);
    }

    /// Abandons both directions; the peer sees `code`.
    pub fn reset(&mut self, code: u64) {
        let mut state = self.link.lock();
        // An error means the stream is already gone (reset by the peer, or ended).
        let _ = state.connection.reset(self.id, code);
        drop(state);
        self.finished = true;
        self.eof = true;
        self.link.touch();
    }

    /// The error for a refused operation: the connection's end if it has ended, the peer's
    /// reset if there was one, otherwise the stream's own.
    fn error(&self, state: &LinkState, e: StreamError) -> io::Error {
        if let Some(e) = &state.error {
            return io::Error::new(io::ErrorKind::ConnectionAborted, e.clone());
        }
        if let Some(code) = state.streams.get(&self.id).and_then(|s| s.reset) {
            return io::Error::new(io::ErrorKind::ConnectionReset, StreamError::Reset(code));
        }
        let kind = match e {
            StreamError::Reset(_) => io::ErrorKind::ConnectionReset,
            StreamError::Finished | StreamError::UnknownStream => io::ErrorKind::BrokenPipe,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.eof || buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let mut state = self.link.lock();
        let result = state.connection.read(self.id, buf.initialize_unfilled());
        match result {
            Ok(Some(n)) => {
                buf.advance(n);
                // Wake the I/O task only when the read opened the peer's window by enough
                // to tell it: once per half window, not once per read.
                let credit = state.connection.credit_pending();
                drop(state);
                if credit {
                    self.link.touch();
                }
                Poll::Ready(Ok(()))
            }
            Ok(None) => {
                // The stream may have closed, freeing a slot the peer can be told of.
                let credit = state.connection.credit_pending();
                drop(state);
                self.eof = true;
                if credit {
                    self.link.touch();
                }
                Poll::Ready(Ok(()))
            }
            Err(StreamError::Blocked) if state.error.is_none() => {
                let id = self.id;
                if let Some(slot) = state.streams.get_mut(&id) {
                    register_once(&mut slot.reader, cx);
                }
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(self.error(&state, e))),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(data)])
    }

    /// Takes the parts' bytes in one turn of the connection's lock, as far as they fit.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        parts: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut state = self.link.lock();
        if let Some(e) = &state.error {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                e.clone(),
            )));
        }
        let result = state.connection.write_vectored(self.id, parts);
        match result {
            Ok(n) => {
                drop(state);
                self.link.touch();
                Poll::Ready(Ok(n))
            }
            Err(StreamError::Blocked) => {
                if let Some(slot) = state.streams.get_mut(&self.id) {
                    register_once(&mut slot.writer, cx);
                }
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(self.error(&state, e))),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Data written is the connection's to deliver; there is nothing to flush.
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Finishes the sending direction.
    fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.finished {
            return Poll::Ready(Ok(()));
        }
        let mut state = self.link.lock();
        match state.connection.finish(self.id) {
            Ok(()) | Err(StreamError::Finished) => {
                drop(state);
                self.finished = true;
                self.link.touch();
                Poll::Ready(Ok(()))
            }
            Err(e) => Poll::Ready(Err(self.error(&state, e))),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let mut state = self.link.lock();
        let slot = state.streams.remove(&self.id);
        let ended = self.finished && self.eof;
        let reset_by_peer = slot.is_some_and(|s| s.reset.is_some());
        if !(ended || reset_by_peer || state.error.is_some()) {
            // Already gone if it errs; nothing more to do then.
            let _ = state.connection.reset(self.id, Self::RESET_DROPPED);
        }
        drop(state);
        // The reset leaves, or the connection closes if this was its last handle.
        self.link.touch();
    }
}
